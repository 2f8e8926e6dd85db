/* Loaded (via nb_ipywidgets_js in _config.yml) between require.js and the ipywidgets HTML manager.
 *
 * 1. The manager finds its icon fonts next to its own module's URL, which require.js would
 *    resolve against the page (notebooks/@jupyter-widgets/...: 404). Point it at the copy the
 *    book serves under _static/selfattn-vendor/ (book/_ext/selfattn_book.py).
 * 2. ipywidgets typesets labels with MathJax 2's API (MathJax.Hub.Queue); the book loads
 *    MathJax 3, so without this shim every widget label throws a TypeError.
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
