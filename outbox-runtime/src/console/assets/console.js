// The overview's live updates: server-sent events from /live, paused and resumed by the
// button, and polling of /?fragment=body every 5 s when the stream fails or the browser
// has no EventSource. The HTML it places is the server's, escaped there.
(function () {
  "use strict";
  var box = document.getElementById("live");
  var button = document.getElementById("live-pause");
  var status = document.getElementById("live-status");
  if (!box || !button || !status) {
    return;
  }
  var source = null;
  var timer = null;
  function say(text) {
    status.textContent = text;
  }
  function poll() {
    fetch("/?fragment=body", { credentials: "same-origin" })
      .then(function (r) {
        if (!r.ok) {
          throw new Error("HTTP " + r.status);
        }
        return r.text();
      })
      .then(function (html) {
        box.innerHTML = html;
        say("polling every 5 s");
      })
      .catch(function () {
        say("updates failed; retrying");
      });
  }
  function polling() {
    if (!timer) {
      timer = setInterval(poll, 5000);
    }
    say("polling every 5 s");
  }
  function start() {
    if (!window.EventSource) {
      polling();
      return;
    }
    source = new EventSource("/live");
    source.addEventListener("overview", function (e) {
      box.innerHTML = e.data;
      say("live");
    });
    source.addEventListener("failed", function (e) {
      say(e.data);
    });
    source.onerror = function () {
      source.close();
      source = null;
      polling();
    };
  }
  function stop() {
    if (source) {
      source.close();
      source = null;
    }
    if (timer) {
      clearInterval(timer);
      timer = null;
    }
  }
  button.addEventListener("click", function () {
    if (button.getAttribute("aria-pressed") === "true") {
      button.setAttribute("aria-pressed", "false");
      button.textContent = "Pause updates";
      start();
    } else {
      stop();
      button.setAttribute("aria-pressed", "true");
      button.textContent = "Resume updates";
      say("paused");
    }
  });
  start();
})();
