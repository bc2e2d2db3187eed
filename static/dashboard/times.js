// Times in the viewer's own zone. The server renders every instant as
// <time datetime="ISO" title="exact UTC" data-at>…UTC…</time> (right without JavaScript);
// here the text becomes local time with its zone, and the date where it is not today.
// Ages and durations (data-tick) are live.js's; their exact instant is in the title.
(function () {
  "use strict";

  function sameDay(a, b) {
    return a.getFullYear() === b.getFullYear() && a.getMonth() === b.getMonth() && a.getDate() === b.getDate();
  }

  var clock = new Intl.DateTimeFormat(undefined, {
    hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23", timeZoneName: "short",
  });
  var dated = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "short", day: "numeric",
    hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23", timeZoneName: "short",
  });
  // Chart labels (a bucket's start): "14:05" (1 h), "14" (24 h), "Tue 18" (7 d).
  var labels = {
    hm: new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", hourCycle: "h23" }),
    h: new Intl.DateTimeFormat(undefined, { hour: "2-digit", hourCycle: "h23" }),
    dh: new Intl.DateTimeFormat(undefined, { weekday: "short", hour: "2-digit", hourCycle: "h23" }),
  };

  function local(el) {
    var at = new Date(el.getAttribute("datetime") || el.getAttribute("data-at-label"));
    if (isNaN(at.getTime())) return;
    if (el.hasAttribute("data-at-label")) {
      el.textContent = (labels[el.getAttribute("data-fmt")] || labels.h).format(at);
      el.dataset.localised = "1";
      return;
    }
    el.textContent = (sameDay(at, new Date()) ? clock : dated).format(at);
    el.dataset.localised = "1";
  }

  function localise(root) {
    // Only what is still in UTC: a fragment swapped in arrives as the server rendered it.
    (root || document).querySelectorAll("time[data-at]:not([data-localised]), [data-at-label]:not([data-localised])").forEach(local);
  }
  window.runwardenTimes = { localise: localise };

  document.addEventListener("DOMContentLoaded", function () { localise(document); });
  // Live fragments (rows, timeline entries, answers) arrive rendered in UTC.
  document.addEventListener("htmx:afterSettle", function () { localise(document); });
  document.addEventListener("htmx:wsAfterMessage", function () { localise(document); });
})();
