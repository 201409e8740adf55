// Live parts without a framework. The console's own stream (/stream, server-sent
// events behind the same login) says when something changed; the page then
// re-reads its own HTML and swaps a region (the server renders it with
// autoescaping; nothing from a model or tool becomes markup here either).
// Without EventSource, or when the stream is refused or fails for good, the
// same regions are polled every data-poll / data-interval ms instead.
//
// - body[data-stream]: the overview stream: the approvals badge (#approvals-badge),
//   the inbox (#inbox-live) and the run list (#runs-live, its query in data-list);
//   a region is re-read when the stream's digest differs from its data-digest.
// - [data-live] (a run page): re-read on each of the run's events (/stream?run=)
//   until the fetched body says the run finished (data-finished="true").
// body[data-live-mode] says which is in use ("stream" or "poll").
(function () {
  "use strict";

  function every(el, attribute) {
    return parseInt(el.getAttribute(attribute) || "2000", 10);
  }

  function mode(name) {
    document.body.setAttribute("data-live-mode", name);
  }

  // The HTML at url; null when it failed. A session that expired answers
  // with the login page: show it whole.
  function html(url) {
    return fetch(url, {credentials: "same-origin"}).then(function (r) {
      if (r.redirected || r.status === 401) { window.location.reload(); return null; }
      return r.ok ? r.text() : null;
    });
  }

  // Fill region from the HTML at url: whole (a fragment: the run page's
  // data-live), or the element of the same id in it (a page). Never under
  // someone's cursor (a comment being typed, a focused button): then once
  // the focus leaves the region.
  function swap(region, url, whole) {
    if (region.contains(document.activeElement) && document.activeElement !== document.body) {
      if (!region.hasAttribute("data-deferred")) {
        region.setAttribute("data-deferred", "");
        region.addEventListener("focusout", function again() {
          region.removeEventListener("focusout", again);
          region.removeAttribute("data-deferred");
          window.setTimeout(function () { swap(region, url, whole); }, 0);
        });
      }
      return Promise.resolve();
    }
    return html(url).then(function (text) {
      if (text === null) { return; }
      if (whole) { region.innerHTML = text; return; }
      var doc = new DOMParser().parseFromString(text, "text/html");
      var fresh = doc.getElementById(region.id);
      if (fresh === null) { return; }
      region.innerHTML = fresh.innerHTML;
      if (fresh.hasAttribute("data-digest")) {
        region.setAttribute("data-digest", fresh.getAttribute("data-digest"));
      }
    });
  }

  function showApprovals(found) {
    var badge = document.getElementById("approvals-badge");
    if (badge !== null) {
      badge.textContent = String(found.mine);
      badge.setAttribute("data-count", String(found.mine));
      badge.setAttribute("aria-label", found.mine + " approvals waiting for you");
      badge.hidden = found.mine === 0;
    }
    var inbox = document.getElementById("inbox-live");
    if (inbox !== null && inbox.getAttribute("data-digest") !== found.digest) {
      swap(inbox, window.location.pathname + window.location.search, false);
    }
  }

  function showRuns(found) {
    var list = document.getElementById("runs-live");
    if (list !== null && list.getAttribute("data-digest") !== found.digest) {
      swap(list, "/runs?" + list.getAttribute("data-list"), false);
    }
  }

  function show(state) {
    if (state.approvals) { showApprovals(state.approvals); }
    if (state.runs) { showRuns(state.runs); }
  }

  function overview() {
    var base = document.body.getAttribute("data-stream");
    if (!base) { return; }
    var list = document.getElementById("runs-live");
    var query = list === null ? "" : "?list=" + encodeURIComponent(list.getAttribute("data-list"));
    var polling = false;
    function poll() {
      if (polling) { return; }
      polling = true;
      mode("poll");
      var wait = every(document.body, "data-poll");
      function tick() {
        if (document.hidden) { window.setTimeout(tick, wait); return; }
        fetch(base + "/state" + query, {credentials: "same-origin"})
          .then(function (r) {
            if (r.status === 401) { window.location.reload(); return null; }
            return r.ok ? r.json() : null;
          })
          .then(function (state) {
            if (state !== null) { show(state); }
            window.setTimeout(tick, wait);
          })
          .catch(function () { window.setTimeout(tick, wait * 2); });
      }
      tick();
    }
    if (!window.EventSource) { poll(); return; }
    var source = new EventSource(base + query);
    source.addEventListener("open", function () { mode("stream"); });
    source.addEventListener("approvals", function (e) { show({approvals: JSON.parse(e.data)}); });
    source.addEventListener("runs", function (e) { show({runs: JSON.parse(e.data)}); });
    source.addEventListener("error", function () {
      // A dropped connection is retried by the browser (CONNECTING); a refusal
      // (logged out, too many streams) closes the source for good.
      if (source.readyState === EventSource.CLOSED) { poll(); }
    });
  }

  function finished(region) {
    var body = region.querySelector("[data-finished]");
    return body !== null && body.getAttribute("data-finished") === "true";
  }

  // Re-read a run page's region; calls during a read fold into one more read.
  function refresher(region) {
    var busy = false;
    var again = false;
    function refresh() {
      if (busy) { again = true; return Promise.resolve(); }
      busy = true;
      return swap(region, region.getAttribute("data-live"), true).then(function () {
        busy = false;
        if (again) { again = false; return refresh(); }
        return null;
      }, function () { busy = false; });
    }
    return refresh;
  }

  function poll(region) {
    var wait = every(region, "data-interval");
    var refresh = refresher(region);
    function tick() {
      if (finished(region)) { return; }
      if (document.hidden) { window.setTimeout(tick, wait); return; }
      refresh().then(function () { window.setTimeout(tick, wait); },
                     function () { window.setTimeout(tick, wait * 2); });
    }
    window.setTimeout(tick, wait);
  }

  function follow(region) {
    var base = document.body.getAttribute("data-stream");
    var body = region.querySelector("[data-run-id]");
    if (finished(region)) { return; }
    if (!window.EventSource || !base || body === null) { poll(region); return; }
    var refresh = refresher(region);
    var source = new EventSource(base + "?run=" + encodeURIComponent(body.getAttribute("data-run-id")));
    var done = false;
    function stop() {
      done = true;
      source.close();
    }
    // On open: events committed between this page's render and the
    // subscription were not sent; one read shows them.
    source.addEventListener("open", function () { refresh(); });
    source.addEventListener("run", function () {
      refresh().then(function () { if (finished(region)) { stop(); } });
    });
    source.addEventListener("end", function () { stop(); refresh(); });
    source.addEventListener("error", function () {
      if (!done && source.readyState === EventSource.CLOSED) { poll(region); }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    overview();
    document.querySelectorAll("[data-live]").forEach(follow);
  });
})();
