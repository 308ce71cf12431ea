// The job page's poller. It asks GET /jobs/<id> (JSON) on the backoff schedule of
// jobs.watch.poll_delay (the page passes the numbers in data-* attributes): every `fast`
// seconds for the first `period` seconds, then every `slow` seconds. A hundred idle tabs must
// not become a hundred requests a second. Unchanged answers are 304s (ETag), hidden tabs do
// not poll, and when the job ends the page reloads once to show its results.
(function () {
  "use strict";
  var root = document.getElementById("job");
  if (!root) return;
  var TERMINAL = { succeeded: true, failed: true };
  var url = root.dataset.url;
  var fast = parseFloat(root.dataset.fast);
  var period = parseFloat(root.dataset.period);
  var slow = parseFloat(root.dataset.slow);
  var started = Date.now();
  var pausedWhileHidden = false;

  function pollDelay(elapsedSeconds) {
    return elapsedSeconds < period ? fast : slow;
  }

  function $(id) { return document.getElementById(id); }

  function setLive(text) {
    var live = $("live");
    if (live) live.textContent = text;
  }

  function render(job) {
    var state = $("state");
    state.textContent = job.state;
    state.className = "state state-" + job.state;
    root.className = "job job-" + job.state;
    root.dataset.state = job.state;
    var total = job.total || 0;
    var done = job.done || 0;
    var percent = total ? Math.floor((100 * done) / total) : (job.state === "succeeded" ? 100 : 0);
    var bar = $("progress");
    bar.max = total || 1;
    bar.value = total ? done : (job.state === "succeeded" ? 1 : 0);
    bar.textContent = percent + "%";
    $("progress-text").textContent = done + " / " + total + " items (" + percent + "%)";
    $("attempts").textContent = job.attempts + " of " + job.max_attempts;
    var updated = $("updated");
    if (job.updated_at) {
      updated.dateTime = job.updated_at;
      updated.textContent = job.updated_at.slice(0, 19).replace("T", " ") + " UTC";
    }
    $("stale").hidden = !job.stale;
    // A failed job's error is why it failed; otherwise it is why an earlier attempt was retried.
    var failed = job.state === "failed";
    $("error-box").hidden = !(failed && job.error);
    $("error").textContent = failed ? job.error || "" : "";
    $("retry-note").hidden = failed || !job.error;
    $("retry-reason").textContent = failed ? "" : job.error || "";
    document.title = "Job " + job.job_id.slice(0, 10) + " · " + job.state + (total ? " " + percent + "%" : "") + " · leash";
  }

  function schedule() {
    var seconds = pollDelay((Date.now() - started) / 1000);
    setTimeout(poll, seconds * 1000);
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
        return response.json();
      })
      .then(function (job) {
        if (job === null) return;
        render(job);
        setLive("Updated " + new Date().toLocaleTimeString() + ".");
        if (TERMINAL[job.state]) {
          window.location.reload();
          return;
        }
        schedule();
      })
      .catch(function (error) {
        setLive("Cannot reach the server (" + error.message + "); retrying.");
        schedule();
      });
  }

  document.addEventListener("visibilitychange", function () {
    if (!document.hidden && pausedWhileHidden) {
      pausedWhileHidden = false;
      poll();
    }
  });

  if (!TERMINAL[root.dataset.state]) schedule();
})();
