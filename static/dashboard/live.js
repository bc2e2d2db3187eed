// Runwarden live pages: the glue around htmx's ws extension. No framework, no build.
//
// - The socket URL carries where the page is (last event seq, committed steps, the
//   in-flight step and how much of its text we show), so a reconnect resumes without
//   a gap or a duplicate.
// - A hidden tab closes its socket and reconnects (catching up) when shown again.
// - Appended fragments (rows, steps, events) replace an element with the same id
//   instead of adding a second copy.
(function () {
  "use strict";
  var live = { socket: null, wrapper: null, paused: false };
  window.runwardenLive = live; // for scripts, tests and the curious operator

  function cursorParams(url) {
    var u = new URL(url, location.href);
    var cursor = document.getElementById("live-cursor");
    if (cursor && cursor.dataset.since) u.searchParams.set("since", cursor.dataset.since);
    if (cursor && cursor.dataset.seq) u.searchParams.set("seq", cursor.dataset.seq);
    if (cursor && cursor.dataset.steps) u.searchParams.set("steps", cursor.dataset.steps);
    var inflight = document.getElementById("inflight");
    if (inflight && !inflight.classList.contains("idle")) {
      var text = document.getElementById("inflight-text");
      u.searchParams.set("step", inflight.dataset.step);
      // Code points, as the server counts them (not UTF-16 units).
      u.searchParams.set("offset", String(Array.from(text ? text.textContent : "").length));
    } else {
      u.searchParams.delete("step");
      u.searchParams.delete("offset");
    }
    return u.toString();
  }

  htmx.createWebSocket = function (url) {
    var socket = new WebSocket(cursorParams(url), []);
    socket.binaryType = htmx.config.wsBinaryType;
    return socket;
  };

  function setState(state, text) {
    var el = document.getElementById("live-state");
    if (!el) return;
    el.dataset.state = state;
    el.textContent = text;
  }

  document.addEventListener("htmx:wsConnecting", function () { setState("connecting", "connecting…"); });
  document.addEventListener("htmx:wsOpen", function (e) {
    live.socket = e.detail.event.target;
    live.wrapper = e.detail.socketWrapper;
    setState("on", "live");
  });
  document.addEventListener("htmx:wsClose", function (e) {
    // A socket replaced by a reconnect may report its close after the new one opened.
    if (live.socket && e.detail.event.target !== live.socket) return;
    var code = e.detail.event.code;
    live.lastClose = code;
    // 4403 (logged out, not allowed) and 4404 (no such run) are answers, not outages:
    // htmx does not retry a 4xxx close, and neither does showing the tab again.
    if (code === 4403 || code === 4404) live.refused = true;
    if (code === 4403) return refusedLogIn();
    if (code === 4404) return setState("refused", "run not found");
    if (live.paused) return setState("paused", "paused (tab hidden)");
    setState("off", "reconnecting…");
  });

  function refusedLogIn() {
    setState("refused", "not allowed: ");
    var link = document.createElement("a");
    var state = document.getElementById("live-state");
    link.href = (state.dataset.login || "/accounts/login/") + "?next=" + encodeURIComponent(location.pathname + location.search);
    link.textContent = "log in again";
    link.dataset.testid = "log-in-again";
    state.appendChild(link);
  }

  document.addEventListener("visibilitychange", function () {
    if (!live.wrapper) return;
    if (document.hidden) {
      live.paused = true;
      if (live.socket && live.socket.readyState <= 1) live.socket.close(1000, "tab hidden");
    } else if (live.paused) {
      live.paused = false;
      if (!live.refused) live.wrapper.reconnect();
    }
  });

  // Upsert into containers marked data-upsert: a fragment element whose id is already
  // on the page replaces it in place; a list row not marked insertable is dropped.
  document.addEventListener("htmx:oobBeforeSwap", function (e) {
    var target = e.detail.target;
    if (!target || !target.hasAttribute("data-upsert")) return;
    var fragment = e.detail.fragment;
    Array.prototype.slice.call(fragment.children).forEach(function (child) {
      var existing = child.id && document.getElementById(child.id);
      if (existing) {
        existing.replaceWith(child);
        htmx.process(child);
      } else if (child.dataset.insert === "0") {
        child.remove();
      }
    });
  });

  // A live re-render of the actions must not eat what the operator is typing (an input
  // for the run, a note): carry typed values and focus into the fresh copy.
  document.addEventListener("htmx:oobBeforeSwap", function (e) {
    var target = e.detail.target;
    if (!target || target.id !== "run-actions") return;
    var focused = document.activeElement && target.contains(document.activeElement) ? document.activeElement.name : null;
    target.querySelectorAll("textarea[name], input[name]:not([type=hidden])").forEach(function (field) {
      if (!field.value) return;
      var twin = e.detail.fragment.querySelector ? e.detail.fragment.querySelector('[name="' + field.name + '"]') : null;
      if (!twin) return;
      if (twin.tagName === "TEXTAREA") twin.textContent = field.value;
      else twin.setAttribute("value", field.value);
    });
    live.refocus = focused;
  });
  document.addEventListener("htmx:oobAfterSwap", function (e) {
    if (!e.detail.target || !live.refocus) return;
    var field = document.querySelector('#run-actions [name="' + live.refocus + '"]');
    live.refocus = null;
    if (field) field.focus();
  });

  // A form in a dialog has been answered (into #outcome): the dialog has done its job.
  document.addEventListener("htmx:afterRequest", function (e) {
    var dialog = e.target.closest && e.target.closest("dialog");
    if (dialog && dialog.open) dialog.close();
  });

  // Ages and running durations tick in the browser; the server sends the instants.
  function span(seconds) {
    seconds = Math.max(0, Math.floor(seconds));
    function pad(n) { return n < 10 ? "0" + n : String(n); }
    if (seconds < 60) return seconds + "s";
    if (seconds < 3600) return Math.floor(seconds / 60) + "m " + pad(seconds % 60) + "s";
    if (seconds < 86400) return Math.floor(seconds / 3600) + "h " + pad(Math.floor(seconds % 3600 / 60)) + "m";
    return Math.floor(seconds / 86400) + "d " + pad(Math.floor(seconds % 86400 / 3600)) + "h";
  }
  function tick() {
    if (document.hidden) return;
    var now = Date.now();
    document.querySelectorAll("time[data-tick]").forEach(function (el) {
      var at = Date.parse(el.getAttribute("datetime"));
      if (!isNaN(at)) el.textContent = span((now - at) / 1000);
    });
  }
  setInterval(tick, 1000);

  // Pages refreshed by polling (triage, audit): an element with data-poll="<s>" gets
  // htmx's "poll" event every <s> seconds while its tab is shown and nobody is picking
  // runs in it (a refresh would drop the selection).
  setInterval(function () {
    if (document.hidden) return;
    var now = Date.now();
    document.querySelectorAll("[data-poll]").forEach(function (el) {
      var every = 1000 * Number(el.dataset.poll);
      if (!el.polledAt) el.polledAt = now; // a fresh copy waits a whole period
      if (!every || now - el.polledAt < every) return;
      if (el.querySelector("input:checked") || el.contains(document.activeElement)) return;
      el.polledAt = now;
      htmx.trigger(el, "poll");
    });
  }, 1000);

  // Dialogs and confirmations, without inline scripts.
  document.addEventListener("click", function (e) {
    var asking = e.target.closest("[data-confirm]");
    if (asking && !window.confirm(asking.dataset.confirm)) {
      e.preventDefault();
      return;
    }
    var opener = e.target.closest("[data-open-dialog]");
    if (opener) {
      var dialog = document.getElementById(opener.dataset.openDialog);
      if (dialog && !dialog.open) dialog.showModal();
      return;
    }
    var closer = e.target.closest("[data-close-dialog]");
    if (closer) closer.closest("dialog").close();
  });
})();
