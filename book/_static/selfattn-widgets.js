/* Loaded (via nb_ipywidgets_js in _config.yml) between require.js and the ipywidgets HTML manager.
 *
 * 1. The manager finds its icon fonts next to its own module's URL, which require.js would
 *    resolve against the page (notebooks/@jupyter-widgets/...: 404). Point it at the copy the
 *    book serves under _static/selfattn-vendor/ (book/_ext/selfattn_book.py).
 * 2. ipywidgets typesets labels with MathJax 2's API (MathJax.Hub.Queue); the book loads
 *    MathJax 3, so without this shim every widget label throws a TypeError.
 * 3. The widgets on a static page are live-only: their callbacks need a kernel, so a slider
 *    dragged here moved its readout and left its figure as it was. Every control of the embedded
 *    widget state (the <script type="application/vnd.jupyter.widget-state+json"> that precedes
 *    this file) gets ipywidgets' own `disabled` trait set before the manager reads it, and each
 *    widget view that holds such a control is marked with a note that says where it works. A view
 *    without controls (tqdm's progress bar: text and a FloatProgress) works as it is and gets no
 *    note. The page's plotly figures, which need no kernel, show the same views.
 */
(function () {
  "use strict";
  var root = new URL(document.documentElement.dataset.content_root || "./", window.location.href);
  window.require.config({
    paths: {
      "@jupyter-widgets/html-manager/dist":
        new URL("_static/selfattn-vendor/html-manager/dist", root).href,
    },
  });
  var NOTE = "Live explorer: its controls need a running kernel, so they are disabled on this page. " +
    "Open the chapter in Jupyter, Colab or Binder to use them; the figures of this page show the same views.";
  var allModels = {};  // model id -> state, over every widget-state script of the page
  Array.prototype.forEach.call(
    document.querySelectorAll('script[type="application/vnd.jupyter.widget-state+json"]'),
    function (script) {
      var spec;
      try { spec = JSON.parse(script.textContent); } catch (err) { return; }
      var models = (spec && spec.state) || {};
      Object.keys(models).forEach(function (id) {
        var state = models[id] && models[id].state;
        if (state) allModels[id] = state;
        if (state && Object.prototype.hasOwnProperty.call(state, "disabled")) state.disabled = true;
      });
      script.textContent = JSON.stringify(spec);
    }
  );
  // Whether the model `id`, or a model it refers to (children, an Output's widgets), is a control:
  // a widget with a `disabled` trait (sliders, text boxes, dropdowns, buttons). A model missing
  // from the state counts as one, so that a view the page cannot inspect keeps its note.
  function hasControl(id, seen) {
    if (seen[id]) return false;
    seen[id] = true;
    var state = allModels[id];
    if (!state) return true;
    if (Object.prototype.hasOwnProperty.call(state, "disabled")) return true;
    var found = false;
    (function refs(value) {
      if (found || value === null) return;
      if (typeof value === "string") {
        if (value.indexOf("IPY_MODEL_") === 0 && allModels[value.slice(10)] !== undefined) {
          found = hasControl(value.slice(10), seen);
        }
      } else if (Array.isArray(value)) {
        value.forEach(refs);
      } else if (typeof value === "object") {
        Object.keys(value).forEach(function (key) {
          if (key === "model_id" && typeof value[key] === "string") found = found || hasControl(value[key], seen);
          else refs(value[key]);
        });
      }
    })(state);
    return found;
  }
  function markLiveOnly() {
    Array.prototype.forEach.call(
      document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]'),
      function (view) {
        var area = view.parentElement;
        if (!area || area.classList.contains("selfattn-live-only")) return;
        var spec;
        try { spec = JSON.parse(view.textContent); } catch (err) { spec = null; }
        if (spec && typeof spec.model_id === "string" && !hasControl(spec.model_id, {})) return;
        area.classList.add("selfattn-live-only");
        var note = document.createElement("p");
        note.className = "selfattn-live-note";
        note.setAttribute("role", "note");
        note.textContent = NOTE;
        area.insertBefore(note, area.firstChild);
      }
    );
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", markLiveOnly);
  else markLiveOnly();
  document.addEventListener("DOMContentLoaded", function () {
    var mj = window.MathJax;
    if (!mj || mj.Hub) return;
    mj.Hub = {
      Queue: function () {
        Array.prototype.forEach.call(arguments, function (job) {
          if (!Array.isArray(job) || job[0] !== "Typeset" || !job[2]) return;
          if (mj.startup && mj.startup.promise && mj.typesetPromise) {
            mj.startup.promise.then(function () { return mj.typesetPromise([job[2]]); });
          }
        });
      },
    };
  });
})();
