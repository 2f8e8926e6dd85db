/* The live models of chapters 14 and 15: run the capstone GPT (14) or the attention-only model with
 * induction heads (15) in the reader's browser.
 *
 * selfattn.live.LivePanel writes, into the page, a <div class="selfattn-livemodel"> holding the model
 * (ONNX, base64), its vocabulary and sizes, and the values the torch model gave at build time for a
 * few fixed prompts. This script (added by book/_ext/selfattn_book.py only to pages that hold such a
 * panel) finds each panel and, once the panel (or its section) is near the viewport or the reader
 * focuses it, loads
 * onnxruntime-web (vendored under _static/selfattn-vendor/onnxruntime-web/, WebAssembly, one thread,
 * no worker: so it works from file:// and from any static host). Then, as the reader types (debounced),
 * it tokenizes the prompt, runs the model once for the heatmaps (one per layer and head) and once per
 * new character for the continuation: no KV cache in the browser, every step recomputes the whole
 * sequence, which for at most a few hundred characters takes milliseconds.
 *
 * Sampling follows selfattn.sampling: greedy is the argmax; otherwise logits minus their maximum,
 * divided by the temperature, filtered by top-k (ties with the k-th kept) and top-p (the smallest set
 * whose probability reaches p, ties with the last kept), then drawn (Math.random: not seeded).
 *
 * Test hook: window.selfattnLive = {ready, run(prompt), generate(prompt, n, options), filter(logits,
 * options), timings}. The tests in tests/book/test_live.py compare it with the build-time values.
 */
(function () {
  "use strict";

  const script = document.currentScript;
  const STATIC = script && script.src ? script.src.replace(/[^/]*$/, "") : "_static/";
  const ORT = STATIC + "selfattn-vendor/onnxruntime-web/";
  // performance.now() (ms since navigation) when a panel was found, when it started loading the model
  // (near the viewport or focused), when the runtime was ready, and when the first heatmaps and the
  // first continuation were drawn.
  const timings = { panel_found: null, start: null, runtime_loaded: null, first_weights: null, first_result: null };
  let runtime = null;
  let readyResolve;
  const ready = new Promise((resolve) => { readyResolve = resolve; });

  // --- loading ------------------------------------------------------------------------------------

  function loadScript(src) {
    return new Promise((resolve, reject) => {
      const s = document.createElement("script");
      s.src = src;
      s.onload = resolve;
      s.onerror = () => reject(new Error("could not load " + src));
      document.head.appendChild(s);
    });
  }

  function base64Bytes(b64) {
    const text = atob(b64);
    const bytes = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
    return bytes;
  }

  async function gunzip(bytes) {
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  function missingFeature() {
    if (typeof WebAssembly === "undefined") return "WebAssembly";
    if (typeof DecompressionStream === "undefined") return "DecompressionStream";
    if (typeof BigInt64Array === "undefined") return "BigInt64Array";
    return null;
  }

  function loadRuntime() {
    if (!runtime) {
      runtime = (async () => {
        await Promise.all([loadScript(ORT + "dist/ort.wasm.min.js"), loadScript(ORT + "ort-wasm-embedded.js")]);
        const embedded = window.selfattnOrtEmbedded, ort = window.ort;
        if (!ort || !embedded) throw new Error("onnxruntime-web did not load");
        ort.env.wasm.numThreads = 1; // no SharedArrayBuffer needed: works without cross-origin isolation
        ort.env.wasm.proxy = false;
        ort.env.logLevel = "error";
        ort.env.wasm.wasmBinary = await gunzip(base64Bytes(embedded.wasm_gzip_base64));
        // the glue is imported from a blob: URL (a file:// page may not import other files)
        ort.env.wasm.wasmPaths = { mjs: URL.createObjectURL(new Blob([embedded.mjs], { type: "text/javascript" })) };
        timings.runtime_loaded = performance.now();
        return ort;
      })();
    }
    return runtime;
  }

  // --- sampling: selfattn.sampling's rules --------------------------------------------------------

  /* The first non-finite logit (NaN or ±Infinity) of a row: an error, never a silent argmax of 0. */
  function requireFinite(row) {
    for (let i = 0; i < row.length; i++) {
      if (!Number.isFinite(row[i])) {
        throw new RangeError(`the model gave a non-finite logit (${row[i]}) for token ${i}; expected finite numbers`);
      }
    }
  }

  function firstMax(row) {
    let best = 0;
    for (let i = 1; i < row.length; i++) if (row[i] > row[best]) best = i; // first of equal maxima, as torch
    return best;
  }

  function argmax(row) {
    requireFinite(row);
    return firstMax(row);
  }

  /* logits (array of numbers) -> a copy with every token outside top-k and the top-p nucleus at -Infinity.
     top_k: null/0 = all; top_p: null/1 = all. As selfattn.sampling.filter_logits (float64 here). */
  function filter(logits, options) {
    const opts = options || {};
    const V = logits.length;
    const x = Array.from(logits, Number);
    const keep = new Array(V).fill(true);
    const k = opts.top_k || null, p = opts.top_p == null ? null : Number(opts.top_p);
    if (k !== null && k < V) {
      const kth = [...x].sort((a, b) => b - a)[k - 1]; // the k-th largest logit; ties with it are kept
      for (let i = 0; i < V; i++) if (!(x[i] >= kth)) keep[i] = false;
    }
    if (p !== null && p < 1) {
      let max = -Infinity;
      for (const v of x) if (v > max) max = v;
      const e = x.map((v) => Math.exp(v - max));
      const total = e.reduce((a, b) => a + b, 0);
      const probs = e.map((v) => v / total);
      const sorted = [...probs].sort((a, b) => b - a);
      let cum = 0, nKeep = 0;
      for (const q of sorted) { // count tokens until the mass of the more probable ones reaches p
        const before = (cum + q) - q;
        cum += q;
        if (before < p) nKeep++;
      }
      const threshold = sorted[Math.max(nKeep, 1) - 1]; // the least probable one kept; ties are kept
      for (let i = 0; i < V; i++) if (!(probs[i] >= threshold)) keep[i] = false;
    }
    return x.map((v, i) => (keep[i] ? v : -Infinity));
  }

  /* The sampling controls' text -> {greedy, temperature, top_k, top_p}, or {error} naming the control,
     the value and the valid range: never a silently different value. Temperature 0 means greedy (the
     limit of sampling as the temperature goes to 0). As selfattn.sampling: temperature >= 0 (finite),
     top-k a positive integer (0 or empty here: every token), top-p in (0, 1]. In greedy mode the three
     boxes are disabled and not read. */
  function parseOptions(mode, temperature, topk, topp) {
    if (mode === "greedy") return { greedy: true, temperature: null, top_k: null, top_p: null }; // the boxes are off
    const bad = (control, value, range) => ({ error: `${control} ${JSON.stringify(String(value))} is not valid: ` +
      `expected ${range}.` });
    const t = String(temperature).trim(), k = String(topk).trim(), p = String(topp).trim();
    const tau = t === "" ? NaN : Number(t);
    if (!Number.isFinite(tau) || tau < 0) return bad("Temperature", temperature, "a number >= 0 (0: greedy)");
    const kk = k === "" ? 0 : Number(k);
    if (!Number.isInteger(kk) || kk < 0) return bad("Top-k", topk, "a whole number >= 1, or 0 for every token");
    const pp = p === "" ? 1 : Number(p);
    if (!Number.isFinite(pp) || !(pp > 0 && pp <= 1)) return bad("Top-p", topp, "a number in (0, 1] (1: every token)");
    return { greedy: mode === "greedy" || tau === 0, temperature: tau, top_k: kk >= 1 ? kk : null,
             top_p: pp < 1 ? pp : null };
  }

  function pick(row, options) {
    const opts = options || {};
    if (opts.greedy !== false) return argmax(row);
    requireFinite(row);
    const tau = Number(opts.temperature);
    if (!(tau > 0)) throw new RangeError(`temperature must be > 0 to sample (0: greedy); got ${opts.temperature}`);
    let max = -Infinity;
    for (const v of row) if (v > max) max = v;
    let scaled = Array.from(row, (v) => (v - max === 0 ? 0 : (v - max) / tau));
    scaled = filter(scaled, opts);
    const e = scaled.map((v) => Math.exp(v));
    const total = e.reduce((a, b) => a + b, 0);
    let u = Math.random() * total;
    for (let i = 0; i < e.length; i++) { u -= e[i]; if (u < 0 && e[i] > 0) return i; }
    return firstMax(scaled); // rounding left u >= 0: the most probable kept token
  }

  const READOUT_HINT = "Point at (or tap) a square to read which character reads which, and with what weight.";

  function plural(n, noun) {
    return `${n} ${noun}${n === 1 ? "" : "s"}`;
  }

  // --- colour: Viridis, as the book's heatmaps -----------------------------------------------------

  const VIRIDIS = [[68, 1, 84], [72, 40, 120], [62, 74, 137], [49, 104, 142], [38, 130, 142],
    [31, 158, 137], [53, 183, 121], [109, 205, 89], [180, 222, 44], [253, 231, 37]];
  function viridis(t) {
    const x = Math.min(1, Math.max(0, t)) * (VIRIDIS.length - 1);
    const i = Math.min(VIRIDIS.length - 2, Math.floor(x)), f = x - i;
    const c = VIRIDIS[i].map((v, j) => Math.round(v + f * (VIRIDIS[i + 1][j] - v)));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }

  // --- one panel ------------------------------------------------------------------------------------

  const panels = [];

  function readJSON(root, cls) {
    const el = root.querySelector("script." + cls);
    return el ? JSON.parse(el.textContent) : null;
  }

  class Panel {
    constructor(root) {
      this.root = root;
      this.config = readJSON(root, "selfattn-livemodel-config");
      this.onnx = readJSON(root, "selfattn-livemodel-onnx");
      this.expected = readJSON(root, "selfattn-livemodel-expected");
      this.long = readJSON(root, "selfattn-livemodel-long");
      this.shown = null;
      this.index = new Map([...this.config.vocab].map((ch, i) => [ch, i]));
      const q = (cls) => root.querySelector("." + cls);
      this.input = root.querySelector(".selfattn-livemodel-prompt input");
      this.mode = q("selfattn-livemodel-mode");
      this.temperature = q("selfattn-livemodel-temperature");
      this.topk = q("selfattn-livemodel-topk");
      this.topp = q("selfattn-livemodel-topp");
      this.nNew = q("selfattn-livemodel-new");
      this.again = q("selfattn-livemodel-again");
      this.status = q("selfattn-livemodel-status");
      this.outPrompt = q("selfattn-livemodel-out-prompt");
      this.outNew = q("selfattn-livemodel-out-new");
      this.grid = q("selfattn-livemodel-grid");
      this.readout = q("selfattn-livemodel-readout");
      this.session = null;
      this.queue = Promise.resolve();
      this.serial = 0;
      this.timer = null;
      this.running = Promise.resolve();
      this.started = false;
    }

    say(text, problem) {
      this.status.textContent = text;
      this.status.classList.toggle("selfattn-livemodel-problem", !!problem);
    }

    start() {
      if (this.started) return;
      this.started = true;
      if (timings.start === null) timings.start = performance.now();
      const missing = missingFeature();
      if (missing) {
        this.say(`The live model needs ${missing}, which this browser lacks or has turned off; the figures ` +
                 "above show the same heads for a fixed snippet.", true);
        this.disable();
        readyResolve({ ok: false, reason: missing });
        return;
      }
      this.say("Loading the model in your browser…");
      const update = () => this.schedule();
      this.input.addEventListener("input", update);
      this.mode.addEventListener("change", () => this.syncSampling());
      this.syncSampling();
      for (const el of [this.mode, this.temperature, this.topk, this.topp, this.nNew]) el.addEventListener("change", update);
      this.again.addEventListener("click", () => this.safeUpdate());
      this.running = this.update();
      this.running.then(() => readyResolve({ ok: true }), (err) => {
        this.say("The live model could not start: " + err.message, true);
        readyResolve({ ok: false, reason: String(err) });
      });
    }

    /* The temperature, top-k and top-p boxes take part only when sampling. */
    syncSampling() {
      const greedy = this.mode.value === "greedy";
      for (const el of [this.temperature, this.topk, this.topp]) el.disabled = greedy;
    }

    disable() {
      for (const el of this.root.querySelectorAll("input, select, button")) el.disabled = true;
    }

    schedule() {
      clearTimeout(this.timer);
      this.timer = setTimeout(() => { this.timer = null; this.safeUpdate(); }, 120); // debounce: one run per pause in typing
    }

    safeUpdate() {
      const serial = this.serial + 1;
      this.running = this.update().catch((err) => {
        if (serial === this.serial) this.refuse("The live model failed on this prompt: " + err.message + ".");
      });
      return this.running;
    }

    /* Resolves once no update is scheduled or running (for the tests). */
    async idle() {
      for (;;) {
        while (this.timer !== null) await new Promise((resolve) => setTimeout(resolve, 30));
        const running = this.running;
        await running;
        if (this.timer === null && running === this.running) return;
      }
    }

    async getSession() {
      if (!this.session) {
        this.session = loadRuntime().then((ort) => ort.InferenceSession.create(base64Bytes(this.onnx),
          { executionProviders: ["wasm"], graphOptimizationLevel: "all" }));
      }
      return this.session;
    }

    /* ids -> {T, logits: Float32Array (T*V), weights: Float32Array (L*H*T*T)}; runs one at a time. */
    forward(ids) {
      const run = this.queue.then(async () => {
        const ort = await loadRuntime();
        const session = await this.getSession();
        const input = new ort.Tensor("int64", BigInt64Array.from(ids, (i) => BigInt(i)), [1, ids.length]);
        const out = await session.run({ input_ids: input });
        return { T: ids.length, logits: out.logits.data, weights: out.weights.data };
      });
      this.queue = run.catch(() => undefined);
      return run;
    }

    encode(text) {
      const unknown = [...new Set([...text].filter((ch) => !this.index.has(ch)))];
      if (unknown.length) {
        const V = this.config.vocab.length;
        const knows = this.config.model === "AttentionOnly"
          ? `it knows ${V} characters, one per token id: ${this.config.vocab}` // selfattn.live.TokenAlphabet
          : `it knows the ${V} characters of its training text`;
        throw new RangeError("not in the model's vocabulary: " + unknown.map((c) => JSON.stringify(c)).join(", ") +
          ` (${knows})`);
      }
      return [...text].map((ch) => this.index.get(ch));
    }

    /* ids -> the ids of up to n new tokens; stops early (returns null) once current() is false:
       a newer update has started, this continuation would be thrown away. */
    async generate(ids, n, options, current) {
      const V = this.config.vocab.length, out = [];
      let seq = ids.slice();
      for (let step = 0; step < n && seq.length < this.config.max_positions; step++) {
        if (current && !current()) return null;
        const { T, logits } = await this.forward(seq);
        const next = pick(logits.subarray((T - 1) * V, T * V), options);
        out.push(next);
        seq = seq.concat([next]);
      }
      return out;
    }

    options() {
      return parseOptions(this.mode.value, this.temperature.value, this.topk.value, this.topp.value);
    }

    /* A number box whose text the browser cannot read as a number (say "3-") reports its value as "":
       which the rules above would read as "every token" (top-k, top-p). Such a box, if it takes part,
       is named here with what it expects; null if every box is readable. */
    unreadable() {
      const boxes = [[this.temperature, "Temperature", "a number >= 0 (0: greedy)"],
        [this.topk, "Top-k", "a whole number >= 1, or 0 for every token"],
        [this.topp, "Top-p", "a number in (0, 1] (1: every token)"],
        [this.nNew, "New characters", `a whole number from 1 to ${this.config.max_new_tokens}`]];
      for (const [box, name, range] of boxes) {
        if (!box.disabled && box.validity && box.validity.badInput) {
          return `the ${name} box holds text that is not a number; expected ${range}.`;
        }
      }
      return null;
    }

    /* Nothing drawn for an earlier prompt stays on show once a prompt or a setting is refused. */
    clear() {
      this.grid.textContent = "";
      this.readout.textContent = "";
      this.outPrompt.textContent = "";
      this.outNew.textContent = "";
      this.shown = null;
    }

    refuse(text) {
      this.clear();
      this.say(text, true);
    }

    async update() {
      const serial = ++this.serial;
      const current = () => serial === this.serial;
      const text = this.input.value;
      if (!text.length) {
        this.refuse("Type a prompt to run the model.");
        return;
      }
      const length = [...text].length, limit = this.config.max_prompt;
      if (length > limit) { // refused, never cut silently (a pasted text would otherwise lose its end)
        const why = limit === this.config.block_size ? "the length the model was trained at"
          : `so that the continuation fits in the ${this.config.max_positions} positions the model takes`;
        this.refuse(`Cannot run this prompt: it has ${length} characters; the panel takes at most ${limit}, ${why}.`);
        return;
      }
      let ids;
      try {
        ids = this.encode(text);
      } catch (err) {
        this.refuse("Cannot run this prompt: " + err.message + ".");
        return;
      }
      const unreadable = this.unreadable();
      if (unreadable) {
        this.refuse("Cannot generate: " + unreadable);
        return;
      }
      const opts = this.options();
      if (opts.error) {
        this.refuse("Cannot generate: " + opts.error);
        return;
      }
      const nText = String(this.nNew.value).trim(), nValue = Number(nText);
      if (!Number.isInteger(nValue) || nValue < 1 || nValue > this.config.max_new_tokens) {
        this.refuse(`Cannot generate: New characters ${JSON.stringify(nText)} is not valid: expected a whole ` +
          `number from 1 to ${this.config.max_new_tokens}.`);
        return;
      }
      const { T, weights } = await this.forward(ids);
      if (!current()) return; // the reader typed on: a newer run will draw
      for (let i = 0; i < weights.length; i++) {
        if (!Number.isFinite(weights[i])) throw new RangeError(`the model gave a non-finite attention weight (${weights[i]})`);
      }
      this.draw(text, T, weights);
      this.shown = { prompt: text, T, weights };
      this.outPrompt.textContent = text;
      this.outNew.textContent = "";
      if (timings.first_weights === null) timings.first_weights = performance.now();
      const next = await this.generate(ids, nValue, opts, current);
      if (!current()) return;
      this.outPrompt.textContent = text;
      this.outNew.textContent = next.map((i) => this.config.vocab[i]).join("");
      this.say(`Continuation (${opts.greedy ? (this.mode.value === "greedy" ? "greedy" : "greedy: temperature 0") : `sampled at temperature ${opts.temperature}` +
        (opts.top_k ? `, top-k ${opts.top_k}` : "") + (opts.top_p ? `, top-p ${opts.top_p}` : "")}), ` +
        `then the weights of the ${plural(T, "prompt character")} in every layer and head.`);
      if (timings.first_result === null) timings.first_result = performance.now();
    }

    draw(text, T, weights) {
      const { n_layers: L, n_heads: H } = this.config;
      const first = this.config.count_from ?? 0; // layers and heads counted from 0, as in the whole course
      const chars = [...text];
      const shown = (ch) => (ch === " " ? "␣" : ch);
      this.grid.textContent = "";
      for (let l = 0; l < L; l++) {
        for (let h = 0; h < H; h++) {
          const base = (l * H + h) * T * T;
          const figure = document.createElement("figure");
          figure.className = "selfattn-livemodel-head";
          const canvas = document.createElement("canvas");
          const size = 144, ratio = window.devicePixelRatio || 1;
          canvas.width = canvas.height = Math.round(size * ratio);
          canvas.style.width = canvas.style.height = size + "px";
          const ctx = canvas.getContext("2d");
          const cell = canvas.width / T;
          let onPrevious = 0, reads = [];
          for (let t = 0; t < T; t++) {
            let best = 0;
            for (let s = 0; s <= t; s++) {
              const w = weights[base + t * T + s];
              ctx.fillStyle = viridis(w);
              ctx.fillRect(Math.floor(s * cell), Math.floor(t * cell), Math.ceil(cell), Math.ceil(cell));
              if (w > weights[base + t * T + best]) best = s;
            }
            if (t > 0) onPrevious += weights[base + t * T + t - 1];
            reads.push(best);
          }
          const prevShare = T > 1 ? (onPrevious / (T - 1)).toFixed(2) : "—"; // one character: no previous one
          const last = chars.length - 1;
          canvas.setAttribute("role", "img");
          canvas.setAttribute("aria-label", `Layer ${l + first}, head ${h + first}: attention weights, rows the ` +
            `${plural(T, "prompt character")} that ask, columns the characters they read; mean weight on the previous ` +
            `character ${T > 1 ? prevShare : "none (one character)"}; the last character "${chars[last]}" reads "${chars[reads[last]]}" most.`);
          const caption = document.createElement("figcaption");
          caption.textContent = `Layer ${l + first} · head ${h + first} — previous char. ${prevShare}; ` +
            `“${shown(chars[last])}” reads “${shown(chars[reads[last]])}”`;
          figure.append(canvas, caption);
          this.grid.append(figure);
          const read = (event) => this.readCell(canvas, event, l, h, base, T, chars, weights);
          canvas.addEventListener("pointermove", read);
          canvas.addEventListener("pointerdown", read); // a tap on a touch screen
          // A mouse (or pen) leaving the square puts the hint back. A finger "leaves" right after every tap (the
          // browser sends pointerup then pointerleave for a touch), which would wipe the readout the tap
          // has just written: on a touch screen the readout stays until the next tap.
          canvas.addEventListener("pointerleave", (event) => {
            if (event.pointerType !== "touch") this.readout.textContent = READOUT_HINT;
          });
          // A mouse reads the readout where it is, under the grid; on a phone the grid is taller than
          // the screen, so a tap puts it just under the square tapped (issue 31: it was below the fold).
          canvas.addEventListener("pointerdown", (event) => this.placeReadout(event.pointerType === "touch" ? canvas : null));
        }
      }
      this.readout.textContent = READOUT_HINT;
    }

    /* The readout under ``canvas`` (a tap), or back in its place under the grid (null). */
    placeReadout(canvas) {
      const near = !!canvas;
      this.readout.classList.toggle("selfattn-livemodel-readout-near", near);
      if (!near) { this.readout.style.top = ""; return; }
      const root = this.root.getBoundingClientRect(), box = canvas.getBoundingClientRect();
      this.readout.style.top = `${box.bottom - root.top + 4}px`;
    }

    /* The cell under the pointer -> the readout line: which character reads which, and the weight. */
    readCell(canvas, event, l, h, base, T, chars, weights) {
      const box = canvas.getBoundingClientRect();
      const side = canvas.clientWidth || box.width; // the drawing, inside the border
      const x = event.clientX - box.left - canvas.clientLeft, y = event.clientY - box.top - canvas.clientTop;
      const t = Math.floor((y / side) * T), s = Math.floor((x / side) * T);
      if (t < 0 || s < 0 || t >= T || s >= T) return;
      const shown = (ch) => (ch === " " ? "␣" : ch);
      const first = this.config.count_from ?? 0;
      const who = `Layer ${l + first} · head ${h + first}: “${shown(chars[t])}” (character ${t + 1})`;
      this.readout.textContent = s > t
        ? `${who} may not read “${shown(chars[s])}” (character ${s + 1}): it comes later (causal mask), weight 0.`
        : `${who} reads “${shown(chars[s])}” (character ${s + 1}) with weight ${weights[base + t * T + s].toFixed(3)}.`;
    }
  }

  // --- the hook the browser tests use --------------------------------------------------------------

  function f32(b64) {
    const bytes = base64Bytes(b64);
    return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
  }

  window.selfattnLive = {
    ready, timings, panels, filter, init,
    async run(prompt) {
      const panel = panels[0];
      const { T, logits, weights } = await panel.forward(panel.encode(prompt));
      return { T, logits: Array.from(logits), weights: Array.from(weights) };
    },
    async generate(prompt, n, options) {
      const panel = panels[0];
      const out = await panel.generate(panel.encode(prompt), n, options || { greedy: true });
      return out.map((i) => panel.config.vocab[i]).join("");
    },
    parseOptions, pick,
    idle() { return panels[0].idle(); },
    /* What the panel shows now: {prompt, T, weights} of the drawn heatmaps, or null (nothing drawn). */
    shown() {
      const s = panels[0].shown;
      return s ? { prompt: s.prompt, T: s.T, weights: Array.from(s.weights) } : null;
    },
    /* The long probe (> block_size positions) the build wrote, decoded, or null in an older page. */
    long() {
      const e = panels[0].long;
      if (!e) return null;
      return { ...e, logits: Array.from(f32(e.logits)), weights: Array.from(f32(e.weights)) };
    },
    expected() {
      return panels[0].expected.map((e) => ({ ...e, logits: Array.from(f32(e.logits)), weights: Array.from(f32(e.weights)) }));
    },
  };

  // --- start: when a panel comes near the viewport or is focused ----------------------------------

  /* Find the panels: called by each panel's own inline script as soon as it is parsed (long before
     DOMContentLoaded on a page with many figures), and at DOMContentLoaded. */
  function init() {
    for (const root of document.querySelectorAll(".selfattn-livemodel")) {
      if (root.dataset.selfattnLiveStarted) continue;
      root.dataset.selfattnLiveStarted = "1";
      const panel = new Panel(root);
      panels.push(panel);
      if (timings.panel_found === null) timings.panel_found = performance.now();
      panel.say("The live model loads when this panel comes into view.");
      const go = () => panel.start();
      root.addEventListener("focusin", go, { once: true });
      // Opened at a link into the panel's section: start now, without waiting for the page to lay out.
      const section = root.closest("section");
      let target = null;
      try { target = location.hash ? document.getElementById(decodeURIComponent(location.hash.slice(1))) : null; } catch (e) { target = null; }
      if (target && section && (section.contains(target) || target.contains(section))) { go(); continue; }
      if ("IntersectionObserver" in window) {
        // the panel, or the section it sits in (a link to the section's heading starts it at once)
        const seen = new IntersectionObserver((entries) => {
          if (entries.some((e) => e.isIntersecting)) { seen.disconnect(); go(); }
        }, { rootMargin: "600px 0px" });
        seen.observe(root);
        if (section) seen.observe(section);
      } else {
        go();
      }
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
