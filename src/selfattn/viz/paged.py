"""Figure builders for chapter 11: a paged KV cache's block tables, and what paging saves.

Builders return plotly Figures (never show them); both are static (hover text and a legend that
hides sequences), so a reader of the book sees everything with no kernel.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..inference.paged import PagedKVCache, simulate_memory_utilisation
from . import describe
from .cost import _COLOURS

__all__ = ["block_table_data", "block_table_figure", "utilisation_figure"]

_EMPTY = "#DDDDDD"  # free blocks and the unused slots of a sequence's last block


def block_table_data(cache: PagedKVCache, seq_ids=None) -> dict:
    """What :func:`block_table_figure` draws: ``{"sequences": {id: {"table", "length"}}, "n_blocks",
    "block_size", "owner"}``, where ``owner[b]`` is the sequence holding physical block b (None if free).

    Raises:
        TypeError: ``cache`` not a PagedKVCache. KeyError: an id not in the cache."""
    if not isinstance(cache, PagedKVCache):
        raise TypeError(f"cache must be a selfattn.inference.paged.PagedKVCache; got {type(cache).__name__}")
    seq_ids = cache.sequences if seq_ids is None else list(seq_ids)
    sequences = {s: {"table": cache.block_table(s), "length": cache.length(s)} for s in seq_ids}
    owner = [None] * cache.allocator.n_blocks
    for s in cache.sequences:
        for block in cache.block_table(s):
            owner[block] = s
    return {"sequences": sequences, "n_blocks": cache.allocator.n_blocks, "block_size": cache.block_size, "owner": owner}


def block_table_figure(cache: PagedKVCache, seq_ids=None) -> go.Figure:
    """Top: each sequence's logical blocks (x) labelled with the physical block they map to. Bottom:
    the pool, one column per physical block and one row per slot, coloured by the sequence whose
    token fills the slot; grey: a slot that holds no token (free blocks, and the end of each
    sequence's last block). Source: chapter 11 (claim 27)."""
    data = block_table_data(cache, seq_ids)
    b, n_blocks = data["block_size"], data["n_blocks"]
    fig = make_subplots(rows=2, cols=1, row_heights=[0.4, 0.6], vertical_spacing=0.24,
                        subplot_titles=("block tables: logical block -> physical block", "the physical pool"))
    names = [str(s) for s in data["sequences"]]
    for i, (s, info) in enumerate(data["sequences"].items()):
        colour, table, length = _COLOURS[i % 6], info["table"], info["length"]
        fig.add_trace(go.Scatter(  # the block table, one marker per logical block
            x=list(range(len(table))), y=[str(s)] * len(table), mode="markers+text", text=[str(p) for p in table],
            textposition="middle center", textfont={"color": "white"}, legendgroup=str(s), name=f"sequence {s}",
            marker={"symbol": "square", "size": 22, "color": colour}, customdata=table,
            hovertemplate=f"sequence {s}, logical block %{{x}} -> physical block %{{customdata}}<extra></extra>"),
            row=1, col=1)
        tokens = list(range(length))  # token t lives in block table[t // b], slot t % b
        fig.add_trace(go.Scatter(
            x=[table[t // b] for t in tokens], y=[t % b for t in tokens], mode="markers", legendgroup=str(s),
            showlegend=False, name=f"sequence {s} tokens", customdata=tokens,
            marker={"symbol": "square", "size": 9, "color": colour},
            hovertemplate=f"sequence {s}, token %{{customdata}}: block %{{x}}, slot %{{y}}<extra></extra>"),
            row=2, col=1)
    filled = {(data["sequences"][s]["table"][t // b], t % b) for s in data["sequences"]
              for t in range(data["sequences"][s]["length"])}
    others = {(blk, slot) for blk, s in enumerate(data["owner"]) if s is not None and s not in data["sequences"]
              for slot in range(b)}  # blocks of sequences not shown: neither empty nor drawn in colour
    empty = [(blk, slot) for blk in range(n_blocks) for slot in range(b) if (blk, slot) not in filled | others]
    fig.add_trace(go.Scatter(x=[e[0] for e in empty], y=[e[1] for e in empty], mode="markers", name="empty slot",
                             marker={"symbol": "square-open", "size": 9, "color": "#999999"},
                             hovertemplate="block %{x}, slot %{y}: empty<extra></extra>"), row=2, col=1)
    fig.update_layout(title=f"Paged KV cache: {len(names)} sequences in a pool of {n_blocks} blocks of {b} slots",
                      height=560, template="plotly_white", legend={"orientation": "h", "y": -0.12})
    fig.update_xaxes(title_text="logical block", dtick=1, row=1, col=1)
    fig.update_yaxes(title_text="sequence", type="category", row=1, col=1)
    fig.update_xaxes(title_text="physical block id", dtick=1 if n_blocks <= 32 else None, range=[-0.6, n_blocks - 0.4],
                     row=2, col=1)
    fig.update_yaxes(title_text="slot in block", autorange="reversed", dtick=1 if b <= 16 else None, row=2, col=1)
    usage = cache.usage()
    return describe(fig, f"Block tables of sequences {', '.join(names)}: each sequence's logical blocks map to "
                         f"physical blocks scattered through a pool of {n_blocks} blocks of {b} slots. "
                         f"{usage.tokens_stored} tokens fill {usage.slots_allocated} allocated slots "
                         f"({100 * usage.utilisation:.1f}%); grey squares are empty slots.")


def utilisation_figure(lengths=None, *, max_len: int = 2048, block_sizes=(1, 4, 16, 64, 256, 1024),
                       n_requests: int = 64, min_len: int = 16, seed: int = 0, budget_slots: int | None = None) -> go.Figure:
    """Left: the share of allocated KV slots that hold a token, reserving ``max_len`` per request
    against paging with each block size. Right: how many of the requests fit in a fixed budget.
    Arguments as :func:`selfattn.inference.paged.simulate_memory_utilisation`. Source: chapter 11."""
    sims = [simulate_memory_utilisation(lengths, max_len=max_len, block_size=bs, n_requests=n_requests,
                                        min_len=min_len, seed=seed, budget_slots=budget_slots) for bs in block_sizes]
    labels = ["reserve max_len"] + [f"paged, b={bs}" for bs in block_sizes]
    util = [sims[0].utilisation_preallocated] + [s.utilisation_paged for s in sims]
    fit = [sims[0].fit_preallocated] + [s.fit_paged for s in sims]
    colours = [_COLOURS[1]] + [_COLOURS[0]] * len(sims)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("slots holding a token", f"requests that fit in {sims[0].budget_slots} slots"))
    fig.add_trace(go.Bar(x=labels, y=[round(100 * u, 2) for u in util], marker_color=colours, name="utilisation",
                         text=[f"{100 * u:.1f}%" for u in util], textposition="outside", showlegend=False,
                         hovertemplate="%{x}: %{y}% of allocated slots hold a token<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=labels, y=fit, marker_color=colours, name="requests that fit", text=fit,
                         textposition="outside", showlegend=False,
                         hovertemplate="%{x}: %{y} requests fit<extra></extra>"), row=1, col=2)
    fig.update_yaxes(title_text="% of allocated slots", range=[0, 110], row=1, col=1)
    fig.update_yaxes(title_text="requests", row=1, col=2)
    n = len(sims[0].lengths)
    fig.update_layout(title=f"{n} requests of {min(sims[0].lengths)}-{max(sims[0].lengths)} tokens, max_len {max_len}",
                      height=440, template="plotly_white", margin={"t": 90})
    return describe(fig, f"For {n} requests, reserving {max_len} slots each fills {100 * util[0]:.1f}% of the "
                         f"allocated slots; paging fills {', '.join(f'{100 * u:.1f}%' for u in util[1:])} with block "
                         f"sizes {', '.join(map(str, block_sizes))}. Within a budget of {sims[0].budget_slots} slots, "
                         f"{fit[0]} requests fit when reserving and {', '.join(map(str, fit[1:]))} when paging.")
