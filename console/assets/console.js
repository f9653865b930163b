// Refreshes the page's live part in place every two seconds, from the fragment URL in its
// data-live attribute; the page reads the same without it. It waits while a form in it is
// being used.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || !live.dataset.live) return;
  function busy() {
    var a = document.activeElement;
    return a && live.contains(a) && (a.tagName === "INPUT" || a.tagName === "BUTTON");
  }
  function refresh() {
    if (busy()) { setTimeout(refresh, 2000); return; }
    fetch(live.dataset.live, {credentials: "same-origin", headers: {"Accept": "text/html"}})
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) { if (!busy()) live.innerHTML = html; })
      .catch(function () {})
      .finally(function () { setTimeout(refresh, 2000); });
  }
  setTimeout(refresh, 2000);
})();
