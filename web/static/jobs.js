// The jobs list refreshes itself while any job on it is queued or running, on the same
// backoff as a job page (every `fast` s for `period` s, then every `slow` s; paused in hidden
// tabs): it fetches this page again and swaps the list in when it changed.
(function () {
  "use strict";
  var box = document.getElementById("jobs");
  if (!box) return;
  var fast = parseFloat(box.dataset.fast);
  var period = parseFloat(box.dataset.period);
  var slow = parseFloat(box.dataset.slow);
  var started = Date.now();
  var pausedWhileHidden = false;

  function schedule() {
    var elapsed = (Date.now() - started) / 1000;
    setTimeout(poll, (elapsed < period ? fast : slow) * 1000);
  }

  function poll() {
    if (document.hidden) {
      pausedWhileHidden = true;
      return;
    }
    fetch(box.dataset.url, { headers: { Accept: "text/html" }, credentials: "same-origin", cache: "no-store" })
      .then(function (response) { return response.text(); })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("jobs");
        if (fresh && fresh.innerHTML !== box.innerHTML) {
          box.innerHTML = fresh.innerHTML;
          box.dataset.active = fresh.dataset.active;
        }
        if (box.dataset.active === "1") schedule();
      })
      .catch(function () { schedule(); });
  }

  document.addEventListener("visibilitychange", function () {
    if (!document.hidden && pausedWhileHidden) {
      pausedWhileHidden = false;
      poll();
    }
  });

  if (box.dataset.active === "1") schedule();
})();
