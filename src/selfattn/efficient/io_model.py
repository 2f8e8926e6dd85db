"""The IO model of attention: bytes moved between slow and fast memory, counted by watching the code.

Dao et al. (2022, Theorem 2) count the numbers an attention kernel moves between a large slow memory
(a GPU's HBM; a CPU's DRAM) and a fast memory of ``M`` numbers (SRAM; cache): standard attention
moves Theta(T d + T^2), the tiled algorithm Theta(T^2 d^2 / M). :func:`count_traffic` counts those
moves for any torch code, without changing it: a ``TorchDispatchMode`` sees every operation the code
runs and records, for each tensor argument and result, how many bytes of which storage it reads or
writes. After the run a storage counts as *slow memory* if it is one of the named inputs, one of the
results, larger than ``fast_memory`` bytes (it cannot fit), or *kept*: a buffer allocated empty and
then filled in pieces by two or more operations, each byte written once (the rows of a loop's
results, such as the per-row maxima and sums a tiled loop saves for the backward pass: a kernel
writes them to slow memory one block of rows at a time, and they grow with the length). Everything
else (tiles and accumulators that the code writes again, running statistics of the current block,
scalars) is fast memory, and moves within it are free. (The rule describes the general tiled loop that
chapter 10 counts: a kernel that finishes such a buffer with one in-place pass over all of it, as the
sliding window's band kernel takes the log2 of its row sums, writes it twice, and the counter then
takes it for a reused fast buffer.) View operations (slicing, reshaping,
transposing) move nothing.

Counting rules, per operation: a tensor argument is *read* (its viewed elements, ``numel *
element_size`` bytes); an argument the operation writes in place is read and written, except that
``copy_``, ``fill_``, ``zero_`` and ``out=`` arguments are only written; a result that is a new storage
is written; allocating (``empty``) moves nothing. Introduced in chapter 10.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["Traffic", "count_traffic", "flash_block_sizes"]

_aten = torch.ops.aten
# Operations that move nothing: allocation without initialisation, and metadata.
_NO_TRAFFIC = {_aten.empty.memory_format, _aten.empty_strided.default, _aten.empty_like.default,
               _aten.sym_size.int, _aten.sym_stride.int, _aten.sym_numel.default}
_ALLOCATE = {_aten.empty.memory_format, _aten.empty_strided.default, _aten.empty_like.default}
_WRITE_ONLY = {_aten.copy_.default, _aten.fill_.Scalar, _aten.fill_.Tensor, _aten.zero_.default}


@dataclass
class Traffic:
    """Bytes one computation moved between slow and fast memory, as :func:`count_traffic` counted.

    ``read`` and ``written``: bytes per slow storage, keyed by the name the caller gave an input
    (``"Q"``, ``"K"``, ...), ``"output"`` for a result, ``"kept"`` for a buffer filled in pieces, each
    byte once (a tiled loop's per-row statistics), or ``"intermediate"`` for any other slow storage
    (a tensor larger than the fast memory, such as standard attention's score matrix).
    ``largest_fast``: the largest storage (bytes) that stayed in fast memory. ``peak_working_set``:
    the most fast memory any one operation needed (bytes): every storage small enough for fast memory
    that was alive at that moment (the named inputs excepted), plus the slow-memory operands the
    operation read or wrote that fit in fast memory (a tile of K; a pass over a larger one streams it). ``operations``: how many operations ran that are not views or
    allocations (each one a separate pass, a separate dispatch)."""

    read: dict[str, int] = field(default_factory=dict)
    written: dict[str, int] = field(default_factory=dict)
    largest_fast: int = 0
    peak_working_set: int = 0
    operations: int = 0

    @property
    def total(self) -> int:
        """All bytes moved: every read from and write to slow memory."""
        return sum(self.read.values()) + sum(self.written.values())


class _TrafficMode(TorchDispatchMode):
    """Records (storage serial, bytes, is_write) for every operation run under it, and the largest
    working set of fast memory an operation needed (see :attr:`Traffic.peak_working_set`)."""

    def __init__(self, fast_memory: int):
        super().__init__()
        self.fast_memory = fast_memory
        self._by_pointer: dict[int, tuple[int, StorageWeakRef]] = {}
        self.nbytes: list[int] = []  # serial -> size of the storage in bytes
        self.events: list[tuple[int, int, bool]] = []
        self.operations = 0
        self._fast_live: dict[int, StorageWeakRef] = {}  # storages small enough for fast memory, alive
        self.snapshots: list[tuple[tuple[int, ...], list[tuple[int, int]]]] = []
        # Buffers allocated empty (and small enough for fast memory): which bytes have been written, and
        # by how many operations; a buffer written twice at one byte is reused (fast) and drops out.
        self._filling: dict[int, tuple[torch.Tensor, list[int]]] = {}
        self._reused: set[int] = set()

    def serial(self, t: torch.Tensor) -> int:
        # A data pointer is reused once a storage is freed: a dead or different storage gets a new serial.
        storage = t.untyped_storage()
        ref = StorageWeakRef(storage)
        known = self._by_pointer.get(storage.data_ptr())
        if known is None or known[1].expired() or known[1].cdata != ref.cdata:
            known = (len(self.nbytes), ref)
            self._by_pointer[storage.data_ptr()] = known
            self.nbytes.append(storage.nbytes())
            if storage.nbytes() <= self.fast_memory:
                self._fast_live[known[0]] = ref
        return known[0]

    def _record(self, t: torch.Tensor, write: bool) -> None:
        self.events.append((self.serial(t), t.numel() * t.element_size(), write))

    def _allocated(self, t: torch.Tensor) -> None:
        serial = self.serial(t)
        if self.nbytes[serial] <= self.fast_memory:  # a larger buffer is slow memory anyway
            self._filling[serial] = (torch.zeros(self.nbytes[serial], dtype=torch.bool), [0])

    def _mark_written(self, written: list[torch.Tensor]) -> None:
        # The bytes each operation writes into a buffer allocated empty: a byte written a second time
        # makes it a reused buffer, which stays fast memory.
        for serial in {self.serial(t) for t in written} & self._filling.keys():
            bitmap, operations = self._filling[serial]
            operations[0] += 1
            for t in (t for t in written if self.serial(t) == serial):
                size = t.element_size()
                first = torch.arange(t.untyped_storage().nbytes() // size)
                elements = first.as_strided(t.shape, t.stride(), t.storage_offset()).reshape(-1)
                written_bytes = (elements[:, None] * size + torch.arange(size)).reshape(-1)
                if bitmap[written_bytes].any():
                    break
                bitmap[written_bytes] = True
            else:
                continue
            del self._filling[serial]
            self._reused.add(serial)

    def kept(self) -> set[int]:
        """Buffers allocated empty and filled in pieces, by two or more operations, each byte once."""
        return {serial for serial, (_, operations) in self._filling.items() if operations[0] >= 2}

    def _working_set(self, operands: list[torch.Tensor]) -> None:
        # What fast memory holds during this operation: every small storage still alive, and the
        # operands it touches (as (serial, bytes)); which of them are slow memory is known only once
        # the results are (see working_set_peak).
        for serial in [s for s, ref in self._fast_live.items() if ref.expired()]:
            del self._fast_live[serial]
        self.snapshots.append((tuple(self._fast_live), [(self.serial(t), t.numel() * t.element_size())
                                                        for t in operands]))

    def working_set_peak(self, slow: set[int]) -> int:
        """The peak over operations of: the small storages alive that are not slow memory, plus the
        pieces of slow memory the operation brings in. An operand of slow memory larger than the fast
        memory cannot be brought in whole: a pass over it (a sum, an elementwise step) streams it
        through in pieces, and its bytes are charged as traffic all the same."""
        def is_slow(serial):
            return serial in slow or self.nbytes[serial] > self.fast_memory
        peak = 0
        for held, operands in self.snapshots:
            resident = sum(self.nbytes[s] for s in held if not is_slow(s))
            brought = sum(n for s, n in operands if is_slow(s) and n <= self.fast_memory)
            peak = max(peak, resident + brought)
        return peak

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func in _ALLOCATE and isinstance(result, torch.Tensor):
            self._allocated(result)
        if func.is_view or func in _NO_TRAFFIC:
            return result
        # (tensor, role) for each tensor argument, by the schema: "read", "write" (copy_, fill_, out=)
        # or "update" (an in-place self: read, then written). The same tensor may appear in two roles,
        # as in torch.exp2(x, out=x): it is then read and written.
        roles: list[tuple[torch.Tensor, str]] = []
        for i, arg in enumerate(func._schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            written = arg.alias_info is not None and arg.alias_info.is_write
            role = ("write" if func in _WRITE_ONLY or arg.name == "out" else "update") if written else "read"
            roles += [(t, role) for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
        results = [v for v in tree_flatten(result)[0] if isinstance(v, torch.Tensor)]
        argument_storages = {self.serial(t) for t, _ in roles}
        if all(r == "read" for _, r in roles) and results and all(self.serial(v) in argument_storages for v in results):
            return result  # a view in all but name (_unsafe_view, alias): it shares its input's numbers
        self.operations += 1
        for t, role in roles:
            if role != "write":
                self._record(t, write=False)
            if role != "read":
                self._record(t, write=True)
        mutated_storages = {self.serial(t) for t, role in roles if role != "read"}
        self._mark_written([t for t, role in roles if role != "read"])
        for value in results:
            if self.serial(value) not in mutated_storages:
                self._record(value, write=True)  # a new result: written once
        self._working_set([t for t, _ in roles])
        return result


def count_traffic(fn, *, fast_memory: int, inputs: dict[str, torch.Tensor]) -> tuple[object, Traffic]:
    """Run ``fn()`` and count the bytes it moves between slow and fast memory (the IO model).

    ``fast_memory``: M, the fast-memory size in bytes (> 0). ``inputs``: the tensors ``fn`` reads from
    slow memory, by name (their storages are slow whatever their size). Returns ``(fn's result,
    Traffic)``; every tensor ``fn`` returns is slow memory (``"output"``), as is any storage larger than
    ``fast_memory`` and any buffer ``fn`` allocates empty and fills in pieces, each byte once
    (``"kept"``: a loop's per-row statistics). Counts are exact for the operations run; code outside torch (NumPy) is not seen.

    The counts are only an IO model's counts if the computation also *fits* in the fast memory: check
    ``Traffic.peak_working_set <= c * fast_memory`` for the constant ``c`` you allow. (Storages of at
    most ``fast_memory`` bytes each are free to move, so code that keeps many of them alive at once,
    more than the fast memory holds, would otherwise be counted as moving almost nothing.)

    Raises ``ValueError`` if ``fast_memory`` is not a positive integer, ``inputs`` is not a dict of
    tensors, two inputs share one storage, or an input is named ``"output"`` or ``"intermediate"``.
    Source: the IO model of Dao et al. (2022), Section 3.2 and Theorem 2; introduced in chapter 10.
    """
    if isinstance(fast_memory, bool) or not isinstance(fast_memory, int) or fast_memory <= 0:
        raise ValueError(f"fast_memory must be a positive number of bytes, got {fast_memory!r}")
    if not isinstance(inputs, dict):
        raise ValueError(f"inputs must be a dict of name -> tensor, got {type(inputs).__name__}")
    storages = {}
    for name, t in inputs.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"inputs[{name!r}] must be a torch.Tensor, got {type(t).__name__}")
        if name in ("output", "intermediate"):
            raise ValueError(f"inputs may not be named {name!r}: the counter uses that name for its own storages")
        other = storages.setdefault(t.untyped_storage().data_ptr(), name)
        if other != name:  # views of one storage (q, k, v split from one qkv) cannot be told apart
            raise ValueError(f"inputs[{name!r}] shares its storage with inputs[{other!r}]: pass separate tensors "
                             "(e.g. .contiguous() copies of the views)")
    mode = _TrafficMode(fast_memory)
    named = {mode.serial(t): name for name, t in inputs.items()}  # serials before the run: inputs first
    with mode:
        result = fn()
    for t in tree_flatten(result)[0]:
        if isinstance(t, torch.Tensor):
            named.setdefault(mode.serial(t), "output")
    for serial in mode.kept():
        named.setdefault(serial, "kept")
    traffic = Traffic(operations=mode.operations, peak_working_set=mode.working_set_peak(set(named)))
    for serial, nbytes, write in mode.events:
        name = named.get(serial, "intermediate" if mode.nbytes[serial] > fast_memory else None)
        if name is None:  # a storage that fits in fast memory: moves within it are free
            traffic.largest_fast = max(traffic.largest_fast, mode.nbytes[serial])
            continue
        side = traffic.written if write else traffic.read
        side[name] = side.get(name, 0) + nbytes
    return result, traffic


def flash_block_sizes(fast_memory: int, d_head: int, element_size: int = 4) -> tuple[int, int]:
    """Tile sizes ``(block_q, block_k)`` that fit a fast memory of ``fast_memory`` bytes.

    Dao et al. (2022), Algorithm 1, line 1: blocks of ``ceil(M / 4d)`` rows for the loop that reads its
    operand once, and ``min(ceil(M / 4d), d)`` for the other, so that a query block, its accumulator, a
    key block and a value block (four blocks of ``d`` numbers per row) and their score tile fit in
    ``M`` numbers (up to the constant the Theta hides). The package's loop runs over query blocks
    outside and key blocks inside (FlashAttention-2's order), so the query block is the large one: it
    decides how many times the keys and values are read, ``ceil(T / block_q)``.

    Raises ``ValueError`` for an argument that is not a positive int, or unless ``fast_memory`` holds at
    least the four rows of ``d_head`` numbers. Introduced in chapter 10.
    """
    for name, value in (("fast_memory", fast_memory), ("d_head", d_head), ("element_size", element_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    numbers = fast_memory // element_size
    if numbers < 4 * d_head:
        raise ValueError(f"fast_memory={fast_memory} bytes holds {numbers} numbers; tiles of d_head={d_head} "
                         f"need at least 4 * d_head = {4 * d_head}")
    rows = math.ceil(numbers / (4 * d_head))
    return rows, min(rows, d_head)
