/* Keep the keyboard controls under a figure in step with the figure's own plotly controls.
 *
 * selfattn.viz's renderer adds, under every figure with plotly sliders or menus, HTML twins of
 * them (a range input per slider, a <select> per dropdown, a row of buttons per button menu), which
 * drive the figure. The other direction was missing for menus: picking an entry of the figure's own
 * dropdown left the "View" select showing the old one, and a slider moved by a menu button (or an
 * animation) left its range input behind. Here every twin is set from the state plotly itself
 * keeps (`layout.sliders[i].active`, `layout.updatemenus[i].active`) whenever plotly reports a
 * change: `plotly_buttonclicked`, `plotly_sliderchange`, `plotly_relayout`, `plotly_update`,
 * `plotly_restyle`, `plotly_animated`.
 */
(function () {
  "use strict";

  function twins(el) {
    var box = el.nextElementSibling;
    if (!box || !box.classList.contains("selfattn-controls")) return null;
    var layout = el.layout || {};
    var sliders = (layout.sliders || []).filter(function (s) { return (s.steps || []).length; });
    var menus = (layout.updatemenus || []).filter(function (m) { return (m.buttons || []).length; });
    var parts = Array.prototype.slice.call(box.children);
    return {
      sliders: sliders.map(function (s, k) { return {spec: s, node: parts[k]}; }),
      menus: menus.map(function (m, k) { return {spec: m, node: parts[sliders.length + k]}; }),
    };
  }

  function setSlider(twin, active) {
    var input = twin.node && twin.node.querySelector('input[type="range"]');
    if (!input || active === undefined || active === null || active < 0) return;
    if (String(input.value) !== String(active)) input.value = active;
    var step = (twin.spec.steps || [])[+input.value] || {};
    var text = step.label !== undefined ? String(step.label) : String(input.value);
    var out = twin.node.querySelector("output");
    if (out) out.textContent = text;
    input.setAttribute("aria-valuetext", text);
  }

  function setMenu(twin, active) {
    if (!twin.node || active === undefined || active === null || active < 0) return;
    var select = twin.node.querySelector("select");
    if (select) {
      if (String(select.value) !== String(active)) select.value = String(active);
      return;
    }
    Array.prototype.forEach.call(twin.node.querySelectorAll("button"), function (b, j) {
      b.setAttribute("aria-pressed", j === +active ? "true" : "false");
    });
  }

  function syncAll(el) {
    var t = twins(el);
    if (!t) return;
    t.sliders.forEach(function (s) { setSlider(s, s.spec.active || 0); });
    t.menus.forEach(function (m) { setMenu(m, m.spec.active === undefined ? 0 : m.spec.active); });
  }

  function attach(el) {
    if (el.dataset.selfattnSync) return;
    el.dataset.selfattnSync = "1";
    var again = function () { syncAll(el); };
    ["plotly_relayout", "plotly_update", "plotly_restyle", "plotly_animated", "plotly_sliderchange"]
      .forEach(function (name) { el.on(name, again); });
    el.on("plotly_buttonclicked", function (e) {
      // plotly has already stored the new `active` in the layout when it emits this event.
      var t = twins(el);
      if (!t || !e || !e.menu) return;
      var k = t.menus.findIndex(function (m) { return m.spec === (el.layout.updatemenus || [])[e.menu._index]; });
      if (k >= 0) setMenu(t.menus[k], e.active);
      again();
    });
    again();
  }

  function watch() {
    var deadline = Date.now() + 30000;
    (function poll() {
      var pending = 0;
      Array.prototype.forEach.call(document.querySelectorAll(".plotly-graph-div"), function (el) {
        if (el.dataset.selfattnSync) return;
        var layout = el.layout;
        var hasControls = layout && ((layout.sliders || []).length || (layout.updatemenus || []).length);
        if (typeof el.on === "function" && layout && !hasControls) { el.dataset.selfattnSync = "0"; return; }
        if (typeof el.on === "function" && twins(el)) { attach(el); return; }
        pending += 1;
      });
      if (pending && Date.now() < deadline) setTimeout(poll, 100);
    })();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", watch);
  else watch();
})();
