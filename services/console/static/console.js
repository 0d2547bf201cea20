// nodeward console: applies the live event stream to the page. Every value is written with
// textContent or a data attribute, never as HTML.
"use strict";
(function () {
  const body = document.body;
  const live = document.getElementById("live");
  const banner = document.getElementById("banner");
  let broken = false;

  function say(text, on) {
    if (live) { live.textContent = text; live.className = on ? "on" : "off"; }
  }
  function tell(text) {
    if (banner) { banner.textContent = text; banner.hidden = false; }
  }
  function byId(id) { return document.getElementById(id); }

  function count(state, by) {
    const chip = byId("count-" + state);
    if (chip) { chip.textContent = String(Number(chip.textContent) + by); }
  }

  const RANK = { failed: 0, degraded: 1, unknown: 2, healthy: 3 };

  function gpu(node, key, state) {
    let cell = byId("g:" + node + ":" + key);
    if (!cell) { return false; }
    if (cell.classList.contains("slice")) {
      // A MIG instance: its GPU's cell takes the worst state of its instances.
      cell.dataset.state = state;
      const parent = cell.parentElement;
      let worst = "healthy";
      parent.querySelectorAll("i.slice").forEach(function (s) {
        const st = s.dataset.state in RANK ? s.dataset.state : "unknown";
        if (RANK[st] < RANK[worst]) { worst = st; }
      });
      cell = parent;
      state = worst;
      key = cell.id.split(":").pop();
    }
    if (cell.dataset.state !== state && cell.closest("a.node")) {
      count(cell.dataset.state, -1);  // the fleet's totals count physical GPUs
      count(state, 1);
    }
    cell.dataset.state = state;
    if (!cell.querySelector("i.slice")) { cell.title = "GPU " + key + " " + state; }
    document.querySelectorAll("[data-for]").forEach(function (el) {
      if (el.dataset.for === cell.id) { el.textContent = state; }
    });
    return true;
  }

  function marks(el, names) {
    el.dataset.marks = names.join(" ");
    const box = el.querySelector(".marks");
    if (!box) { return; }
    box.replaceChildren();
    names.forEach(function (m) {
      const b = document.createElement("b");
      b.className = "mark";
      b.dataset.mark = m;
      b.title = m;
      b.textContent = el.tagName === "A" ? m.charAt(0).toUpperCase() : m;
      box.append(b, " ");
    });
  }

  function node(m) {
    const el = byId("n:" + m.node);
    if (!el) {
      if (byId("shown")) { tell("The fleet changed: reload to see " + m.node + "."); }
      return;
    }
    el.dataset.health = m.health;
    marks(el, m.marks);
    if (el.tagName === "A") { el.title = m.attention.join("; ") || m.node; }
    Object.keys(m.gpus).forEach(function (k) { gpu(m.node, k, m.gpus[k]); });
  }

  function row(table, cells, attrs) {
    const tr = document.createElement("tr");
    tr.className = "new";
    Object.keys(attrs).forEach(function (k) { tr.dataset[k] = attrs[k]; });
    cells.forEach(function (text, i) {
      const td = document.createElement("td");
      td.textContent = text;
      if (table.id === "alerts" && i === 4) { td.className = "output"; }
      tr.append(td);
    });
    table.tBodies[0].prepend(tr);
    const empty = byId(table.id + "-empty");
    if (empty) { empty.remove(); }
  }

  function contains(hay, needle) { return !needle || hay.toLowerCase().indexOf(needle.toLowerCase()) >= 0; }

  function escalated(m) {
    // On the node page of the node recovery gave up on: say so at once (the page drawn again
    // shows the banner with what to do).
    const h1 = document.querySelector("h1[data-node]");
    if (!h1 || byId("escalated") || m.target !== "node/" + h1.dataset.node) { return; }
    if (m.outcome === "applied" || m.outcome === "dry_run") {
      tell(h1.dataset.node + " needs a human: recovery gave up just now. Reload to see why and what to do.");
    }
  }

  function action(m) {
    if (m.action === "escalate") { escalated(m); }
    const t = byId("actions");
    if (!t) { return; }
    const f = t.dataset;
    if (f.node && m.target.indexOf(f.node) < 0 && m.reason.indexOf(f.node) < 0) { return; }
    if ((f.action && f.action !== m.action) || (f.outcome && f.outcome !== m.outcome)) { return; }
    if (!contains(m.actor, f.actor) || !(contains(m.target, f.q) || contains(m.reason, f.q))) { return; }
    const outcome = m.outcome + (m.dry_run ? " (dry run)" : "");
    row(t, [m.time.replace("T", " ").slice(0, 19), m.action, m.target, outcome, m.reason, m.actor],
      { outcome: m.outcome });
  }

  function alert(m) {
    const t = byId("alerts");
    if (t) {
      row(t, [m.time.replace("T", " ").slice(0, 19), m.priority, m.rule, m.hostname, m.output],
        { priority: m.priority });
    }
  }

  function isolated(m) {
    const t = byId("isolated");
    if (!t) { return; }
    const pod = m.pod.replace(" (dry run)", "");
    if (t.querySelector("tr[data-pod='" + CSS.escape(pod) + "']")) { return; }
    row(t, [m.pod, m.node, m.since.replace("T", " ").slice(0, 19), m.rule, m.reason], { pod: pod });
  }

  function released(m) {
    const t = byId("isolated");
    const tr = t && t.querySelector("tr[data-pod='" + CSS.escape(m.pod) + "']");
    if (tr) { tr.remove(); }
  }

  function dead(m) {
    const t = byId("dead");
    if (t) {
      row(t, [m.time.replace("T", " ").slice(0, 19), m.stream + "/" + m.consumer, m.subject, m.reason, m.error], {});
    }
  }

  // What the services' views say of the fleet (`nodeward.views`), redrawn whole.
  function rows(m) {
    if (!byId("shown")) { return; }  // the fleet page only
    let box = byId("fleet-rows");
    if (!box) {
      box = document.createElement("section");
      box.className = "rows";
      box.id = "fleet-rows";
      document.querySelector("section.summary").after(box);
    }
    box.replaceChildren();
    let list = null;
    let said = null;
    m.rows.forEach(function (r) {
      if (r.section !== said) {
        said = r.section;
        const h = document.createElement("h2");
        h.textContent = r.section;
        list = document.createElement("ul");
        box.append(h, list);
      }
      const li = document.createElement("li");
      li.dataset.severity = r.severity;
      li.textContent = r.text;
      list.append(li);
    });
  }

  const handlers = {
    gpu: function (m) {
      gpu(m.node, m.gpu, m.state);
      const el = byId("n:" + m.node);
      if (el) { el.dataset.health = m.health; }
    },
    node: node,
    action: action,
    alert: alert,
    dead: dead,
    isolated: isolated,
    released: released,
    rows: rows,
    fleet: function () { if (byId("shown")) { tell("Nodes joined or left the fleet: reload to see them."); } },
  };

  const url = body.dataset.events;
  if (!url || !window.EventSource) { say("not live", false); return; }
  const source = new EventSource(url);
  source.onopen = function () {
    if (broken) { window.location.reload(); return; }  // updates were missed: draw afresh
    say("live", true);
    body.dataset.live = "on";
  };
  source.onerror = function () { broken = true; say("reconnecting", false); body.dataset.live = "off"; };
  source.onmessage = function (e) {
    let m;
    try { m = JSON.parse(e.data); } catch (err) { return; }
    const h = handlers[m.t];
    if (h) { h(m); }
  };
})();
