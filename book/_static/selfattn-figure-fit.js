/* Fit every figure's title and legend inside the figure, at any width (issue 31).
 *
 * plotly draws a title on one line and clips it at the figure's edge, and a legend placed right of
 * the plot (or one row of a long horizontal legend) runs off a narrow figure: on a 390 px phone
 * 24 titles and legends of the book were cut. Once a figure is drawn, and again when it is
 * resized or animated (frames may change the title), this script measures the title and the legend
 * against the figure's SVG:
 *
 * - a title wider than the figure is wrapped at spaces (`<br>`), and the top margin and the
 *   figure's height grow by the lines added, so the plot keeps its size;
 * - a legend that sticks out is laid out in rows under the plot (below the x-axis title, which the
 *   figure's bottom margin grows to leave room for); trace names longer than the width are wrapped.
 *
 * What the figure's author set is kept in `el._selfattnFit.base` and restored before each new fit,
 * so a wider window gets the original layout back.
 */
(function () {
  "use strict";

  var copy = function (v) { return v === undefined ? undefined : JSON.parse(JSON.stringify(v)); };

  function wrap(text, maxChars) {
    // Greedy wrap of each line of `text` (lines split at <br>) to at most maxChars characters.
    var plain = function (s) { return s.replace(/<[^>]*>/g, ""); };
    return String(text).split(/<br\s*\/?>/i).map(function (line) {
      var words = line.split(" "), out = [], cur = "";
      words.forEach(function (w) {
        var next = cur ? cur + " " + w : w;
        if (cur && plain(next).length > maxChars) { out.push(cur); cur = w; } else { cur = next; }
      });
      if (cur) out.push(cur);
      return out.join("<br>");
    }).join("<br>");
  }

  function lines(text) { return String(text || "").split(/<br\s*\/?>/i).length; }

  function titleText(layout) {
    var t = layout.title;
    return typeof t === "string" ? t : (t && t.text) || "";
  }

  function outside(r, frame) {
    return r.width > 0 && (r.left < frame.left - 1 || r.right > frame.right + 1 || r.top < frame.top - 1 ||
                           r.bottom > frame.bottom + 1);
  }

  function fit(el) {
    var P = window.Plotly, state = el._selfattnFit;
    var svg = el.querySelector("svg.main-svg");
    if (!P || !svg || state.busy) return Promise.resolve();
    state.busy = true;
    var layout = el.layout || {};
    // A frame or a relayout from elsewhere may have set a new title: that is the author's title now.
    if (titleText(layout) !== state.wrappedTitle) state.base.title = titleText(layout);
    var orNull = function (v) { return v === undefined ? null : v; };
    var restore = {"title.text": state.base.title, "title.x": orNull(state.base.titleX),
                   "title.xanchor": orNull(state.base.titleXanchor), "title.xref": orNull(state.base.titleXref),
                   "margin.t": orNull(state.base.margin.t), "margin.b": orNull(state.base.margin.b),
                   height: orNull(state.base.height), legend: copy(state.base.legend) || {}};
    var names = state.baseNames;
    return Promise.resolve(state.changed ? P.relayout(el, restore) : null).then(function () {
      if (state.renamed) return P.restyle(el, {name: names}, names.map(function (_, i) { return i; }));
    }).then(function () {
      state.changed = state.renamed = false;
      var frame = svg.getBoundingClientRect(), full = el._fullLayout || {}, update = {}, extra = 0;
      var title = el.querySelector(".g-gtitle .gtitle");
      if (title) {
        var r = title.getBoundingClientRect(), text = state.base.title;
        var room = frame.width - 24, longest = Math.max.apply(null, text.split(/<br\s*\/?>/i).map(function (s) {
          return s.replace(/<[^>]*>/g, "").length; }));
        if (outside(r, frame) || r.width > room) {
          var perChar = r.width / Math.max(1, longest), wrapped = wrap(text, Math.max(8, Math.floor(room / perChar)));
          var size = ((full.title || {}).font || {}).size || 17;
          extra = (lines(wrapped) - lines(text)) * Math.ceil(size * 1.3);
          update["title.text"] = wrapped;
          update["title.x"] = 0.5; update["title.xanchor"] = "center"; update["title.xref"] = "container";
          update["margin.t"] = (full.margin || {}).t + extra;
          state.wrappedTitle = wrapped;
        }
      }
      var legend = el.querySelector(".legend");
      var legendOut = legend && full.showlegend !== false && outside(legend.getBoundingClientRect(), frame);
      if (legendOut) {
        update.legend = Object.assign(copy(state.base.legend) || {}, {orientation: "h", x: 0, xanchor: "left",
          xref: "container", yref: "container", y: 0, yanchor: "bottom", entrywidthmode: "pixels"});
      }
      if (!Object.keys(update).length) return null;
      if (extra) update.height = (full.height || 450) + extra;
      state.changed = true;
      state.wrappedTitle = update["title.text"] || null;
      return P.relayout(el, update).then(function () {
        if (!legendOut) return null;
        // Trace names wider than the figure are wrapped, then the bottom margin leaves the legend room.
        var room = frame.width - 60, wrapName = function (name) {
          return String(name).replace(/<[^>]*>/g, "").length * 7 > room ? wrap(name, Math.max(8, Math.floor(room / 7))) : name;
        };
        var wrappedNames = names.map(wrapName);
        var renamed = wrappedNames.some(function (n, i) { return n !== names[i]; });
        return Promise.resolve(renamed ? P.restyle(el, {name: wrappedNames}, names.map(function (_, i) { return i; })) : null)
          .then(function () {
            state.renamed = renamed;
            var box = el.querySelector(".legend").getBoundingClientRect(), size = el._fullLayout._size;
            var below = el._fullLayout.height - size.t - size.h;  // what is under the plot now: ticks, axis title, slider
            var grow = Math.ceil(box.height) + 8;
            return P.relayout(el, {"margin.b": below + grow, height: el._fullLayout.height + grow});
          });
      });
    }).finally(function () { state.busy = false; el.dataset.selfattnFit = "done"; });
  }

  function attach(el) {
    if (el._selfattnFit) return;
    var layout = el.layout || {};
    el._selfattnFit = {
      base: {title: titleText(layout), legend: copy(layout.legend), height: layout.height,
             titleX: (layout.title || {}).x, titleXanchor: (layout.title || {}).xanchor, titleXref: (layout.title || {}).xref,
             margin: {t: (layout.margin || {}).t, b: (layout.margin || {}).b}},
      baseNames: (el.data || []).map(function (t) { return t.name === undefined ? "" : t.name; }),
      changed: false, renamed: false, busy: false, wrappedTitle: null, width: el.clientWidth,
    };
    fit(el);
    el.on("plotly_animated", function () { fit(el); });
    window.addEventListener("resize", function () {
      clearTimeout(el._selfattnFitTimer);
      el._selfattnFitTimer = setTimeout(function () {
        if (el.clientWidth !== el._selfattnFit.width) { el._selfattnFit.width = el.clientWidth; fit(el); }
      }, 250);
    });
  }

  function watch() {
    var deadline = Date.now() + 30000;
    (function poll() {
      var pending = 0;
      Array.prototype.forEach.call(document.querySelectorAll(".plotly-graph-div"), function (el) {
        if (el._selfattnFit) return;
        if (typeof el.on === "function" && el._fullLayout && el.querySelector("svg.main-svg")) attach(el);
        else pending += 1;
      });
      if (pending && Date.now() < deadline) setTimeout(poll, 100);
    })();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", watch);
  else watch();
})();
