// corral's web UI: live run statuses and log tails over server-sent events. No inline script anywhere
// (the Content-Security-Policy allows only this file); data is written as text, never as HTML, except the
// rows the server renders (escaped) for runs that appear.
"use strict";
(function () {
  function setStatus(el, status) {
    el.textContent = status;
    el.className = "status s-" + status;
  }

  function liveRuns(table) {
    var tbody = table.querySelector("tbody");
    var note = document.querySelector("[data-live-state]");
    var ids = Array.prototype.map.call(table.querySelectorAll("tr[data-run]"), function (tr) { return tr.dataset.run; });
    var url = table.dataset.liveRuns + (ids.length ? "&ids=" + ids.join(",") : "");
    var es = new EventSource(url);
    es.onopen = function () { if (note) note.textContent = "Live: statuses update as they change."; };
    es.onerror = function () { if (note) note.textContent = "Live updates paused; reconnecting…"; };
    es.addEventListener("run", function (e) {
      var st = JSON.parse(e.data);
      var message = st.status_message === st.status ? "" : st.status_message;
      document.querySelectorAll('[data-live-status="' + st.id + '"]').forEach(function (el) { setStatus(el, st.status); });
      document.querySelectorAll('[data-live-message="' + st.id + '"]').forEach(function (el) { el.textContent = message; });
      document.querySelectorAll('[data-cost="' + st.id + '"]').forEach(function (el) { el.textContent = st.cost; });
      document.querySelectorAll('[data-backend="' + st.id + '"]').forEach(function (el) { el.textContent = st.backend; });
      Object.keys(st.jobs || {}).forEach(function (sid) {
        document.querySelectorAll('[data-live-status="' + sid + '"]').forEach(function (el) { setStatus(el, st.jobs[sid][0]); });
        document.querySelectorAll('[data-live-message="' + sid + '"]').forEach(function (el) {
          el.textContent = st.jobs[sid][1] === st.jobs[sid][0] ? "" : st.jobs[sid][1];
        });
      });
      if (["done", "failed", "terminated"].indexOf(st.status) >= 0) {
        document.querySelectorAll('tr[data-run="' + st.id + '"] input[type=checkbox]').forEach(function (c) { c.checked = false; c.disabled = true; });
      }
    });
    es.addEventListener("new", function (e) {
      var d = JSON.parse(e.data);
      if (tbody.querySelector('tr[data-run="' + d.id + '"]')) return;
      tbody.insertAdjacentHTML("afterbegin", d.html);
      var empty = document.querySelector("[data-empty-runs]");
      if (empty) empty.remove();
    });
  }

  function appendLines(pre, lines, atTop) {
    var frag = document.createDocumentFragment();
    lines.forEach(function (l) {
      var span = document.createElement("span");
      if (l[1] === "stderr") span.className = "err";
      span.textContent = l[2].endsWith("\n") ? l[2] : l[2] + "\n";
      span.title = l[0];
      frag.appendChild(span);
    });
    if (atTop) {
      var before = pre.scrollHeight;
      pre.insertBefore(frag, pre.firstChild);
      pre.scrollTop += pre.scrollHeight - before;
    } else {
      var follow = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 30;
      pre.appendChild(frag);
      // keep at most 5000 lines in the page; older ones are a click away
      while (pre.childNodes.length > 5000) pre.removeChild(pre.firstChild);
      if (follow) pre.scrollTop = pre.scrollHeight;
    }
  }

  function liveLogs(box) {
    var pre = box.querySelector("[data-log-lines]");
    var note = box.querySelector("[data-log-state]");
    var older = box.querySelector("[data-load-older]");
    var before = null;
    var es = new EventSource(box.dataset.logs);
    es.onopen = function () { note.textContent = "Following the log: new lines appear as they are written."; };
    es.onerror = function () { note.textContent = "Log stream paused; reconnecting…"; };
    es.addEventListener("older", function (e) {
      before = JSON.parse(e.data).before;
      older.hidden = !before;
    });
    es.addEventListener("lines", function (e) { appendLines(pre, JSON.parse(e.data), false); });
    older.addEventListener("click", function () {
      if (!before) return;
      fetch(box.dataset.older + "&before=" + encodeURIComponent(before), { credentials: "same-origin" })
        .then(function (r) { return r.json(); })
        .then(function (d) { appendLines(pre, d.lines, true); before = d.before; older.hidden = !before; });
    });
  }

  // the model playground: chat completions streamed (SSE over fetch) from the project's model endpoint, with
  // the page's session (the cookie) and its CSRF token; every piece is written as text
  function sseContent(line) {
    if (line.indexOf("data:") !== 0) return "";
    var data = line.slice(5).trim();
    if (!data || data === "[DONE]") return "";
    try {
      var choice = (JSON.parse(data).choices || [])[0] || {};
      return (choice.delta && choice.delta.content) || (choice.message && choice.message.content) || "";
    } catch (e) { return ""; }
  }

  function playground(box) {
    var chat = box.querySelector("[data-chat]");
    var form = box.querySelector("[data-chat-form]");
    var state = box.querySelector("[data-chat-state]");
    var input = form.querySelector("textarea");
    var button = form.querySelector("button");
    var messages = [];
    function add(role, text) {
      var li = document.createElement("li");
      li.className = "chat-" + role;
      var who = document.createElement("strong");
      who.textContent = role === "user" ? "You" : box.dataset.model;
      var body = document.createElement("p");
      body.textContent = text;
      li.appendChild(who);
      li.appendChild(body);
      chat.appendChild(li);
      return body;
    }
    function stream(r, out) {
      if (!r.ok) return r.text().then(function (t) { throw new Error("The model endpoint answered " + r.status + ": " + t.slice(0, 300)); });
      var reader = r.body.getReader(), decoder = new TextDecoder(), rest = "";
      function pump() {
        return reader.read().then(function (got) {
          if (got.done) return;
          var lines = (rest + decoder.decode(got.value, { stream: true })).split("\n");
          rest = lines.pop();
          lines.forEach(function (line) { out.textContent += sseContent(line); });
          return pump();
        });
      }
      return pump();
    }
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var text = input.value.trim();
      if (!text) return;
      messages.push({ role: "user", content: text });
      add("user", text);
      input.value = "";
      var out = add("assistant", "");
      button.disabled = true;
      state.textContent = "Answering…";
      fetch(box.dataset.endpoint, {
        method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-Corral-CSRF": box.dataset.csrf },
        body: JSON.stringify({ model: box.dataset.model, messages: messages, stream: true })
      }).then(function (r) { return stream(r, out); }).then(function () {
        messages.push({ role: "assistant", content: out.textContent });
        state.textContent = "Answered.";
      }, function (e) {
        messages.pop();
        out.parentNode.className = "chat-error";
        out.textContent = e.message;
        state.textContent = "The request failed.";
      }).then(function () { button.disabled = false; input.focus(); });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live-runs]").forEach(liveRuns);
    document.querySelectorAll("[data-logs]").forEach(liveLogs);
    document.querySelectorAll("[data-playground]").forEach(playground);
  });
})();
