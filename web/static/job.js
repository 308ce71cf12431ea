// The job page's poller. It asks GET /jobs/<id> (JSON) on the backoff schedule of
// jobs.read.poll_schedule.poll_delay (the page passes the numbers in data-* attributes): every `fast`
// seconds for the first `period` seconds, then every `slow` seconds. A hundred idle tabs must
// not become a hundred requests a second. Unchanged answers are 304s (ETag), hidden tabs do
// not poll. When the job changed, the page's own HTML is fetched and its job section swapped
// in: one rendering path (the server's template) for the first view and every update.
(function () {
  "use strict";
  var root = document.getElementById("job");
  if (!root) return;
  // The states a job never leaves (jobs.core.states.TERMINAL), from the page.
  var TERMINAL = {};
  (root.dataset.terminal || "").split(" ").forEach(function (state) { if (state) TERMINAL[state] = true; });
  var url = root.dataset.url;
  var fast = parseFloat(root.dataset.fast);
  var period = parseFloat(root.dataset.period);
  var slow = parseFloat(root.dataset.slow);
  var started = Date.now();
  var pausedWhileHidden = false;
  var lastSeen = null;

  function pollDelay(elapsedSeconds) {
    return elapsedSeconds < period ? fast : slow;
  }

  function setLive(text) {
    var live = document.getElementById("live");
    if (live) live.textContent = text;
  }

  function schedule() {
    setTimeout(poll, pollDelay((Date.now() - started) / 1000) * 1000);
  }

  function swapIn(html) {
    var fresh = new DOMParser().parseFromString(html, "text/html");
    var section = fresh.getElementById("job");
    if (!section) return;
    root.innerHTML = section.innerHTML;
    root.className = section.className;
    root.dataset.state = section.dataset.state;
    document.title = fresh.title;
  }

  function poll() {
    if (document.hidden) {
      pausedWhileHidden = true;
      return;
    }
    // cache: "no-cache" revalidates with If-None-Match, so an unchanged job costs a 304.
    fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin", cache: "no-cache" })
      .then(function (response) {
        if (response.status === 404) {
          setLive("This job no longer exists (results are kept for a limited time).");
          return null;
        }
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (text) {
        if (text === null) return null;
        if (text === lastSeen) return { changed: false, job: JSON.parse(text) };
        lastSeen = text;
        var job = JSON.parse(text);
        // The page itself, at its current results page: the fresh state, history, results.
        return fetch(window.location.href, { headers: { Accept: "text/html" }, credentials: "same-origin",
                                             cache: "no-store" })
          .then(function (page) { return page.text(); })
          .then(function (html) { swapIn(html); return { changed: true, job: job }; });
      })
      .then(function (outcome) {
        if (outcome === null) return;
        if (TERMINAL[outcome.job.state]) return;  // the swapped-in page is the final one
        setLive("Updated " + new Date().toISOString().slice(11, 19) + " UTC.");
        schedule();
      })
      .catch(function (error) {
        setLive("Cannot reach the server (" + error.message + "); retrying.");
        schedule();
      });
  }

  // Cancel opens its confirm page (the same as without JavaScript); the button cannot be pressed twice.
  root.addEventListener("submit", function (event) {
    var button = event.target.querySelector("#cancel-button");
    if (!button) return;
    if (button.disabled) { event.preventDefault(); return; }
    button.disabled = true;
  });

  document.addEventListener("visibilitychange", function () {
    if (!document.hidden && pausedWhileHidden) {
      pausedWhileHidden = false;
      poll();
    }
  });

  if (!TERMINAL[root.dataset.state]) schedule();
})();
