// Live parts without a framework: a region with data-live is re-fetched every
// data-interval ms and its content replaced, until the fetched body says the
// run finished (data-finished="true"). The server renders the fragment with
// autoescaping; nothing from a model or tool becomes markup here either.
(function () {
  "use strict";
  function finished(region) {
    var body = region.querySelector("[data-finished]");
    return body !== null && body.getAttribute("data-finished") === "true";
  }
  function poll(region) {
    var every = parseInt(region.getAttribute("data-interval") || "2000", 10);
    function tick() {
      if (finished(region)) { return; }
      if (document.hidden) { window.setTimeout(tick, every); return; }
      fetch(region.getAttribute("data-live"), {credentials: "same-origin"})
        .then(function (r) {
          // A session that expired answers with the login page: show it whole.
          if (r.redirected) { window.location.reload(); return null; }
          return r.ok ? r.text() : null;
        })
        .then(function (html) {
          if (html !== null && !region.contains(document.activeElement)) {
            region.innerHTML = html;
          }
          window.setTimeout(tick, every);
        })
        .catch(function () { window.setTimeout(tick, every * 2); });
    }
    window.setTimeout(tick, every);
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live]").forEach(poll);
  });
})();
