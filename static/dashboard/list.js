// The run list's own behaviour: live rows kept in the list's order and page size, the
// operator's selection and scroll kept across updates, and the keyboard.
// (The socket itself is live.js's; this file only shapes what lands in #run-rows.)
(function () {
  "use strict";

  function rowsBox() { return document.getElementById("run-rows"); }
  function rows() { return Array.prototype.slice.call(document.querySelectorAll("#run-rows > [data-testid=run-row]")); }

  // Newest first: a row sorts before another when its (created, id) key is greater.
  // Keys are fixed-width UTC digits then the hex id, so string order is the list's order.
  function before(a, b) { return a.dataset.sort > b.dataset.sort; }

  // The row nearest the top of the viewport, and where it is: after an update the page
  // scrolls by however much that row moved, so what the operator reads stays put.
  function anchor() {
    if (window.scrollY <= 0) return null; // at the top: new runs may push in and be seen
    var all = rows();
    for (var i = 0; i < all.length; i++) {
      var box = all[i].getBoundingClientRect();
      if (box.bottom > 0) return { el: all[i], top: box.top };
    }
    return null;
  }

  function carryState(from, to) {
    var was = from.querySelector("input[type=checkbox]");
    var now = to.querySelector("input[type=checkbox]");
    if (was && now) now.checked = was.checked;
    if (from.classList.contains("selected")) select(to, false);
  }

  function insertSorted(box, row) {
    var all = rows();
    for (var i = 0; i < all.length; i++) {
      if (before(row, all[i])) return box.insertBefore(row, all[i]);
    }
    box.appendChild(row);
  }

  // A page holds its page size: rows past it go, and "older" starts after the last kept.
  function trim(box) {
    var size = parseInt(box.dataset.pageSize, 10) || 50;
    var all = rows();
    if (all.length <= size) return;
    var keep = all[size - 1];
    for (var i = size; i < all.length; i++) {
      if (all[i].classList.contains("selected")) select(keep, false);
      all[i].remove();
    }
    var older = document.querySelector("a[data-older]");
    if (older) {
      var u = new URL(older.href, location.href);
      u.searchParams.set("before", keep.dataset.cursor);
      older.href = u.toString();
      older.hidden = false;
    }
  }

  // Live rows for #run-rows: an update replaces its row in place (keeping the checkbox
  // and the keyboard selection); a run that no longer matches the filters goes; a new
  // run goes where the list's order puts it, only on the first page, and only if it
  // belongs on it. Every child is taken out of the fragment, so htmx inserts nothing.
  document.addEventListener("htmx:oobBeforeSwap", function (e) {
    var box = rowsBox();
    if (!box || e.detail.target !== box) return;
    var full = rows().length >= (parseInt(box.dataset.pageSize, 10) || 50);
    Array.prototype.slice.call(e.detail.fragment.children).forEach(function (child) {
      var existing = child.id && document.getElementById(child.id);
      if (child.hasAttribute("data-remove")) {
        if (existing) {
          if (existing.classList.contains("selected")) select(neighbour(existing), false);
          existing.remove();
        }
        child.remove();
      } else if (existing) {
        carryState(existing, child);
        existing.replaceWith(child);
        htmx.process(child);
      } else if (child.dataset.insert === "1") {
        var all = rows();
        var last = all[all.length - 1];
        if (full && last && !before(child, last)) return child.remove(); // it belongs on a later page
        insertSorted(box, child);
        htmx.process(child);
      } else {
        child.remove();
      }
    });
    trim(box);
  });

  // Scroll: taken before a socket message is applied, restored after all its swaps
  // (rows, counts above them) are done.
  var mark = null;
  document.addEventListener("htmx:wsBeforeMessage", function () { mark = rowsBox() ? anchor() : null; });
  document.addEventListener("htmx:wsAfterMessage", function () {
    if (mark && mark.el.isConnected) window.scrollBy(0, mark.el.getBoundingClientRect().top - mark.top);
    mark = null;
  });

  // Keyboard: / search, j/k move, a abort, Enter open, ? the keys. Not while typing.
  function selected() { return document.querySelector("#run-rows > .row.selected"); }

  function neighbour(row) {
    var next = row.nextElementSibling || row.previousElementSibling;
    return next && next.dataset.testid === "run-row" ? next : null;
  }

  function select(row, scroll) {
    var current = selected();
    if (current) { current.classList.remove("selected"); current.removeAttribute("aria-selected"); }
    if (!row) return;
    row.classList.add("selected");
    row.setAttribute("aria-selected", "true");
    if (scroll) row.scrollIntoView({ block: "nearest" });
  }

  function move(step) {
    var all = rows();
    if (!all.length) return;
    var at = all.indexOf(selected());
    var to = at < 0 ? (step > 0 ? 0 : all.length - 1) : Math.min(all.length - 1, Math.max(0, at + step));
    select(all[to], true);
  }

  function typing(target) {
    return target.closest("input, textarea, select, [contenteditable]") !== null;
  }

  function openAbort(row) {
    var dialog = document.getElementById("key-abort");
    if (!dialog || !row || dialog.open) return;
    dialog.querySelector("input[name=run]").value = row.dataset.runId;
    dialog.querySelector("[data-run-title]").textContent = row.querySelector(".title").textContent.trim();
    dialog.showModal();
  }

  document.addEventListener("keydown", function (e) {
    if (!rowsBox() || e.ctrlKey || e.metaKey || e.altKey || typing(e.target)) return;
    if (document.querySelector("dialog[open]")) return; // a dialog has the keys (Escape closes it)
    var handled = true;
    if (e.key === "/") {
      var search = document.querySelector(".filters input[type=search]");
      if (search) { search.focus(); search.select(); }
    } else if (e.key === "j") {
      move(1);
    } else if (e.key === "k") {
      move(-1);
    } else if (e.key === "Enter" && selected()) {
      location.href = selected().querySelector(".title a").href;
    } else if (e.key === "a" && selected()) {
      openAbort(selected());
    } else if (e.key === "?") {
      var keys = document.getElementById("keys");
      if (keys) keys.showModal();
    } else {
      handled = false;
    }
    if (handled) e.preventDefault();
  });

  document.addEventListener("click", function (e) {
    var row = e.target.closest("#run-rows > .row");
    if (row && !e.target.closest("a, input, button")) select(row, false);
  });
})();
