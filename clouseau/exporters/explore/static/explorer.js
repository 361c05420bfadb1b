/* clouseau explorer: draws the document in #clouseau-data with dagre (vendored, MIT).
 * Every string from the document reaches the page through textContent or setAttribute,
 * never innerHTML, so names holding markup are shown as text. */
(function () {
  "use strict";
  const SVGNS = "http://www.w3.org/2000/svg";
  const D = JSON.parse(document.getElementById("clouseau-data").textContent);
  const N = D.nodes, G = D.groups, STATS = D.stats || {}, DIFF = D.diff;
  const $ = (id) => document.getElementById(id);

  // -- structure ----------------------------------------------------------------------
  const anc = [];  // anc[g]: the groups from the root down to g (parents precede children)
  const kidGroups = G.map(() => []), kidNodes = G.map(() => []), groupSize = G.map(() => 0);
  G.forEach((g, i) => {
    anc.push(g.up < 0 ? [i] : anc[g.up].concat([i]));
    if (g.up >= 0) kidGroups[g.up].push(i);
  });
  const users = N.map(() => []);
  N.forEach((n, i) => {
    kidNodes[n.g].push(i);
    for (const g of anc[n.g]) groupSize[g] += 1;
    for (const [src] of n.in) users[src].push(i);
  });
  const firstNode = G.map(() => Infinity);  // execution order of a group: its first node
  N.forEach((n, i) => { for (const g of anc[n.g]) if (i < firstNode[g]) firstNode[g] = i; });
  const byPath = new Map(G.map((g, i) => [g.p, i]));
  const outNode = G.map(() => -1);  // the node whose alias is the module's path
  N.forEach((n, i) => (n.al || []).concat([n.n]).forEach((a) => {
    const g = byPath.get(a);
    if (g !== undefined && g > 0) outNode[g] = i;
  }));

  const expanded = new Set();
  G.forEach((g, i) => { if (g.d <= D.depth) expanded.add(i); });
  expanded.add(0);

  function rep(i) {
    for (const g of anc[N[i].g]) if (!expanded.has(g)) return "g" + g;
    return "n" + i;
  }

  // -- glob search: clouseau/ir/selection.py glob_matches with fnmatch.fnmatchcase --------
  const reCache = new Map();
  function translate(pat) {
    let res = "", i = 0;
    const n = pat.length;
    while (i < n) {
      const c = pat[i++];
      if (c === "*") { if (!res.endsWith(".*")) res += ".*"; }
      else if (c === "?") res += ".";
      else if (c === "[") {
        let j = i;
        if (j < n && pat[j] === "!") j++;
        if (j < n && pat[j] === "]") j++;
        while (j < n && pat[j] !== "]") j++;
        if (j >= n) res += "\\[";
        else {
          let stuff = pat.slice(i, j).replace(/\\/g, "\\\\");
          i = j + 1;
          if (stuff[0] === "!") stuff = "^" + stuff.slice(1);
          else if (stuff[0] === "^" || stuff[0] === "[") stuff = "\\" + stuff;
          res += stuff ? "[" + stuff + "]" : "(?!)";
        }
      } else res += c.replace(/[.*+?^${}()|[\]\\\/-]/g, "\\$&");
    }
    return new RegExp("^(?:" + res + ")$", "s");
  }
  function fnmatch(name, pat) {
    let re = reCache.get(pat);
    if (!re) { re = translate(pat); reCache.set(pat, re); }
    return re.test(name);
  }
  function globMatches(pat, name, node, alias) {
    if (pat.includes(".")) return fnmatch(name, pat);
    const last = name.slice(name.lastIndexOf(".") + 1);
    return fnmatch(last, pat) || (!alias && fnmatch(N[node].o, pat));
  }
  function search(query) {
    const items = query.split(/[\s,]+/).filter(Boolean);
    const inc = items.filter((s) => !s.startsWith("!")), exc = items.filter((s) => s.startsWith("!")).map((s) => s.slice(1));
    const pts = [];
    if (!items.length) return pts;
    for (const [name, node, alias] of D.points) {
      const hit = (!inc.length || inc.some((p) => globMatches(p, name, node, alias))) &&
        !exc.some((p) => globMatches(p, name, node, alias));
      if (hit) pts.push([name, node]);
    }
    return pts;
  }

  // -- metrics for colouring ----------------------------------------------------------------
  const num = (v) => (typeof v === "number" ? v : v === "inf" ? Infinity : v === "-inf" ? -Infinity : NaN);
  const METRICS = {
    absmean: ["mean |x|", (i) => avg(i, "absmean")],
    std: ["std", (i) => avg(i, "std")],
    nonfinite: ["NaN + inf count", (i) => STATS[i] ? STATS[i].calls.reduce((s, c) => s + c.nan + c.inf, 0) : undefined],
    rel: ["max rel error (diff)", (i) => worst(i, "rel")],
    abs: ["max abs error (diff)", (i) => worst(i, "abs")],
  };
  function avg(i, key) {
    const s = STATS[i];
    if (!s) return undefined;
    const v = s.calls.map((c) => num(c[key])).filter((x) => isFinite(x));
    return v.length ? v.reduce((a, b) => a + b, 0) / v.length : NaN;
  }
  function worst(i, key) {
    const rows = DIFF && DIFF.rows[i];
    if (!rows) return undefined;
    return Math.max(...rows.map((r) => num(r[key])));
  }
  let metric = "";
  let metricValues = null, metricRange = null;
  function computeMetric() {
    metricValues = null;
    if (!metric) return;
    const f = METRICS[metric][1];
    const vals = N.map((_, i) => f(i));
    const finite = vals.filter((v) => v !== undefined && isFinite(v) && v > 0);
    const lo = finite.length ? Math.log10(Math.min(...finite)) : 0;
    const hi = finite.length ? Math.log10(Math.max(...finite)) : 0;
    metricValues = vals;
    metricRange = [lo, hi];
    const legend = $("legend");
    legend.textContent = metric === "nonfinite" ? "red: holds NaN or inf; green: all finite" : finite.length
      ? `${METRICS[metric][1] ? METRICS[metric][0] : ""}: ${fmt(10 ** lo)} … ${fmt(10 ** hi)} (log scale; red: NaN/inf)`
      : `${METRICS[metric][0]}: no positive values`;
  }
  const PALETTE = [[239, 243, 255], [189, 215, 238], [107, 174, 214], [253, 174, 97], [215, 48, 39]];
  function colour(v) {
    if (v === undefined) return null;
    if (metric === "nonfinite") return v > 0 ? "#b71c1c" : "#e8f5e9";  // any NaN/inf: red
    if (!isFinite(v)) return "#b71c1c";
    if (v <= 0) return "rgb(239,243,255)";
    const [lo, hi] = metricRange;
    const t = hi > lo ? (Math.log10(v) - lo) / (hi - lo) : 1;
    const x = Math.min(Math.max(t, 0), 1) * (PALETTE.length - 1), k = Math.min(Math.floor(x), PALETTE.length - 2);
    const a = PALETTE[k], b = PALETTE[k + 1], f = x - k;
    return `rgb(${a.map((c, j) => Math.round(c + (b[j] - c) * f)).join(",")})`;
  }
  function luminance(c) {
    const v = c[0] === "#" ? [1, 3, 5].map((j) => parseInt(c.slice(j, j + 2), 16)) : c.match(/\d+/g).map(Number);
    return 0.299 * v[0] + 0.587 * v[1] + 0.114 * v[2];
  }
  function groupMetric(g) {
    let best;
    N.forEach((n, i) => {
      if (!anc[n.g].includes(g)) return;
      const v = metricValues[i];
      if (v !== undefined && (best === undefined || !(v <= best))) best = v;
    });
    return best;
  }

  // -- formatting -------------------------------------------------------------------------
  function fmt(v) {
    if (typeof v === "string") return v;
    if (v === null || v === undefined) return "—";
    if (Number.isInteger(v) && Math.abs(v) < 1e15) return v.toLocaleString("en-US");
    return Math.abs(v) !== 0 && (Math.abs(v) < 1e-3 || Math.abs(v) >= 1e6) ? v.toExponential(5) : v.toPrecision(6);
  }
  function el(tag, attrs, text, ns) {
    const e = ns ? document.createElementNS(SVGNS, tag) : document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  const short = (s, n) => (s.length > n ? s.slice(0, n - 1) + "…" : s);

  // -- layout and drawing --------------------------------------------------------------------
  let matchNodes = new Set(), pathNodes = new Set(DIFF ? DIFF.path : []);
  let selected = null, order = [], layoutMs = 0;
  const firstDiv = DIFF && DIFF.first >= 0 ? DIFF.first : -1;

  function itemLabel(id) {
    const k = +id.slice(1);
    if (id[0] === "g") {
      const g = G[k], o = outNode[k];
      const last = g.syn ? g.t : g.p.slice(g.p.lastIndexOf(".") + 1);
      return [`▸ ${last}${g.syn ? "" : " (" + g.t + ")"}`, `${groupSize[k]} ops${o >= 0 ? " → " + N[o].s : ""}`];
    }
    const n = N[k], gp = G[n.g].p;
    const name = gp && n.n.startsWith(gp + ".") ? n.n.slice(gp.length + 1) : n.n;
    return [name, `${n.o}  ${n.s}`];
  }

  function render() {
    const t0 = performance.now();
    const g = new dagre.graphlib.Graph({ compound: true });
    g.setGraph({ rankdir: "TB", nodesep: 16, ranksep: 30, marginx: 16, marginy: 28 });
    g.setDefaultEdgeLabel(() => ({}));
    const seen = new Map(), clusters = new Set();
    const reps = N.map((_, i) => rep(i));
    reps.forEach((id, i) => {
      if (seen.has(id)) return;
      seen.set(id, i);
      const [a, b] = itemLabel(id);
      // Approximate text widths: 11px bold labels and 9px monospace details, plus the dot.
      g.setNode(id, { width: Math.min(Math.max(Math.min(a.length, 42) * 7 + 26, Math.min(b.length, 42) * 5.6 + 16), 300), height: 34 });
      const k = +id.slice(1), parent = id[0] === "g" ? G[k].up : N[k].g;
      if (parent > 0) { g.setParent(id, "c" + parent); addCluster(g, parent, clusters); }
    });
    const edges = new Map();
    N.forEach((n, i) => {
      for (const [src, label] of n.in) {
        const a = reps[src], b = reps[i];
        if (a === b) continue;
        const key = a + "|" + b;
        if (!edges.has(key)) { edges.set(key, { a, b, label, path: pathNodes.has(src) && pathNodes.has(i) }); g.setEdge(a, b); }
        else if (pathNodes.has(src) && pathNodes.has(i)) edges.get(key).path = true;
      }
    });
    dagre.layout(g);
    order = [...seen.entries()].sort((x, y) => x[1] - y[1]).map((x) => x[0]);
    draw(g, seen, clusters, edges);
    layoutMs = performance.now() - t0;
    $("count").textContent = `${seen.size} boxes shown of ${N.length} nodes`;
    return g;
  }
  function addCluster(g, k, clusters) {
    if (clusters.has(k)) return;
    clusters.add(k);
    g.setNode("c" + k, { label: G[k].p });
    if (G[k].up > 0) { g.setParent("c" + k, "c" + G[k].up); addCluster(g, G[k].up, clusters); }
  }

  const svg = $("graph"), view = { x: 0, y: 0, w: 100, h: 100 };
  let bounds = { w: 100, h: 100 };
  function draw(g, seen, clusters, edges) {
    const root = el("g", { id: "viewport" }, undefined, true);
    const cl = el("g", { class: "clusters" }, undefined, true);
    [...clusters].sort((a, b) => G[a].d - G[b].d).forEach((k) => {
      const c = g.node("c" + k);
      const box = el("g", { class: "cluster", "data-id": "g" + k, "data-path": G[k].p }, undefined, true);
      // dagre leaves no room for a cluster's title: the box grows upwards to hold it.
      box.appendChild(el("rect", { x: c.x - c.width / 2, y: c.y - c.height / 2 - 12, width: c.width, height: c.height + 12, rx: 6 }, undefined, true));
      box.appendChild(el("text", { x: c.x - c.width / 2 + 6, y: c.y - c.height / 2 - 2 }, `${G[k].p} (${G[k].t})`, true));
      cl.appendChild(box);
    });
    const ed = el("g", { class: "edges" }, undefined, true);
    for (const e of edges.values()) {
      const pts = g.edge(e.a, e.b).points;
      const d = "M" + pts.map((p) => `${p.x.toFixed(1)},${p.y.toFixed(1)}`).join("L");
      const grp = el("g", { class: "edge" + (e.path ? " div-path" : "") }, undefined, true);
      grp.appendChild(el("path", { d }, undefined, true));
      if (e.label && pts.length) {
        const m = pts[Math.floor(pts.length / 2)];
        grp.appendChild(el("text", { x: m.x + 4, y: m.y }, e.label, true));
      }
      ed.appendChild(grp);
    }
    const nd = el("g", { class: "nodes" }, undefined, true);
    for (const id of seen.keys()) nd.appendChild(drawItem(g.node(id), id));
    root.append(cl, ed, nd);
    svg.replaceChildren(root);
    const gr = g.graph();
    bounds = { w: gr.width || 100, h: gr.height || 100 };
    applyMarks();
  }
  function drawItem(box, id) {
    const k = +id.slice(1), isGroup = id[0] === "g";
    const cls = ["node", isGroup ? "group" : "op"];
    const attrs = { "data-id": id, transform: `translate(${box.x - box.width / 2},${box.y - box.height / 2})`, tabindex: -1 };
    if (isGroup) attrs["data-path"] = G[k].p;
    else {
      const n = N[k];
      attrs["data-name"] = n.n;
      cls.push("kind-" + n.k);
      if (n.sv || STATS[k]) cls.push("saved");
      if (STATS[k] && STATS[k].calls.some((c) => c.nan || c.inf)) cls.push("nonfinite");
      if (DIFF && DIFF.rows[k] && DIFF.rows[k].some((r) => r.diverges)) cls.push("diverges");
    }
    const e = el("g", attrs, undefined, true);
    e.setAttribute("class", cls.join(" "));
    const [a, b] = itemLabel(id);
    e.appendChild(el("rect", { width: box.width, height: box.height, rx: isGroup ? 8 : 4 }, undefined, true));
    e.appendChild(el("text", { x: 8, y: 14, class: "l1" }, short(a, 42), true));
    e.appendChild(el("text", { x: 8, y: 27, class: "l2" }, short(b, 42), true));
    if (!isGroup && k === firstDiv) e.appendChild(el("text", { x: 0, y: -4, class: "badge" }, "▼ first divergence", true));
    if (cls.includes("saved")) e.appendChild(el("circle", { cx: box.width - 7, cy: 7, r: 3.5, class: "saved-dot" }, undefined, true));
    const tip = isGroup ? `${G[k].p} (${G[k].t})` : `${N[k].n}\n${N[k].o} → ${N[k].s}${N[k].dt ? " " + N[k].dt : ""}${N[k].m ? "\nin " + N[k].m + " (" + N[k].mt + ")" : ""}`;
    e.appendChild(el("title", {}, tip, true));
    return e;
  }
  function applyMarks() {
    const hidden = new Map();  // rep group id -> matches inside
    for (const i of matchNodes) { const r = rep(i); if (r[0] === "g") hidden.set(r, (hidden.get(r) || 0) + 1); }
    const firstRep = firstDiv >= 0 ? rep(firstDiv) : null;
    for (const e of svg.querySelectorAll(".node")) {
      const id = e.getAttribute("data-id"), k = +id.slice(1), isGroup = id[0] === "g";
      e.classList.toggle("match", !isGroup && matchNodes.has(k));
      e.classList.toggle("has-match", hidden.has(id));
      e.classList.toggle("first-div", id === firstRep && !isGroup);
      e.classList.toggle("holds-first-div", id === firstRep && isGroup);
      e.classList.toggle("div-path", !isGroup && pathNodes.has(k));
      e.classList.toggle("selected", id === selected);
      const v = metricValues ? (isGroup ? groupMetric(k) : metricValues[k]) : undefined;
      const c = metricValues ? colour(v) : null;
      e.querySelector("rect").style.fill = c || "";
      e.classList.toggle("dark", !!c && luminance(c) < 140);
    }
  }

  // -- pan and zoom ----------------------------------------------------------------------
  function setView() { svg.setAttribute("viewBox", `${view.x} ${view.y} ${view.w} ${view.h}`); }
  // The whole graph in view; with ``readable``, never so small that labels cannot be read
  // (a tall graph then opens at its top, to be panned) nor larger than 1.25x.
  function fit(readable) {
    const r = svg.getBoundingClientRect(), W = r.width || 800, H = r.height || 600;
    const bw = bounds.w + 20, bh = bounds.h + 20;
    let s = Math.min(W / bw, H / bh, 1.25);
    if (readable === true) s = Math.max(s, 0.6);
    const w = W / s, h = H / s;
    view.x = bw <= w ? -10 - (w - bw) / 2 : -10;
    view.y = bh <= h ? -10 - (h - bh) / 2 : -10;
    view.w = w; view.h = h;
    setView();
  }
  function zoom(f, cx, cy) {
    cx = cx === undefined ? view.x + view.w / 2 : cx; cy = cy === undefined ? view.y + view.h / 2 : cy;
    view.x = cx - (cx - view.x) * f; view.y = cy - (cy - view.y) * f; view.w *= f; view.h *= f;
    setView();
  }
  function toGraph(ev) {
    const r = svg.getBoundingClientRect();
    return [view.x + (ev.clientX - r.left) / r.width * view.w, view.y + (ev.clientY - r.top) / r.height * view.h];
  }
  svg.addEventListener("wheel", (ev) => { ev.preventDefault(); const [x, y] = toGraph(ev); zoom(ev.deltaY > 0 ? 1.15 : 1 / 1.15, x, y); }, { passive: false });
  let drag = null;
  svg.addEventListener("mousedown", (ev) => { drag = { x: ev.clientX, y: ev.clientY, vx: view.x, vy: view.y, moved: false }; });
  window.addEventListener("mousemove", (ev) => {
    if (!drag) return;
    const r = svg.getBoundingClientRect(), dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
    view.x = drag.vx - dx / r.width * view.w; view.y = drag.vy - dy / r.height * view.h; setView();
  });
  window.addEventListener("mouseup", () => { setTimeout(() => (drag = null), 0); });
  function reveal(id, centre) {
    const e = svg.querySelector(`[data-id="${id}"]`);
    if (!e) return;
    const b = e.getBBox(), t = e.transform.baseVal.consolidate(), m = t ? t.matrix : { e: 0, f: 0 };
    const x = m.e + b.x + b.width / 2, y = m.f + b.y + Math.min(b.height / 2, view.h / 3), mx = view.w * 0.1, my = view.h * 0.1;
    const outside = x < view.x + mx || x > view.x + view.w - mx || y < view.y + my || y > view.y + view.h - my;
    if (centre || outside) { view.x = x - view.w / 2; view.y = y - view.h / 2; setView(); }
  }

  // -- interaction ---------------------------------------------------------------------------
  function toggle(k, open) {
    if (k === 0) return;
    if (open === undefined) open = !expanded.has(k);
    if (open) expanded.add(k); else { expanded.delete(k); for (const g of G.keys()) if (anc[g].includes(k) && g !== k) expanded.delete(g); }
    render();
  }
  function expandTo(i) { let changed = false; for (const g of anc[N[i].g]) if (!expanded.has(g)) { expanded.add(g); changed = true; } return changed; }
  svg.addEventListener("click", (ev) => {
    if (drag && drag.moved) return;
    const t = ev.target.closest("[data-id]");
    if (t) select(t.getAttribute("data-id"));
  });
  svg.addEventListener("dblclick", (ev) => {
    const t = ev.target.closest("[data-id]");
    if (!t) return;
    const id = t.getAttribute("data-id");
    if (id[0] === "g") { toggle(+id.slice(1)); select(id); }
  });
  function select(id) {
    selected = id;
    applyMarks();
    showPanel(id);
    reveal(id);
  }
  function neighbour(id, dir) {
    const i = order.indexOf(id);
    if (dir === "next" || dir === "prev") return order[Math.min(Math.max(i + (dir === "next" ? 1 : -1), 0), order.length - 1)];
    const members = id[0] === "n" ? [+id.slice(1)] : N.map((_, j) => j).filter((j) => rep(j) === id);
    for (const j of members) {
      const cands = dir === "down" ? users[j] : N[j].in.map((x) => x[0]);
      for (const c of cands) { const r = rep(c); if (r !== id) return r; }
    }
    return id;
  }
  document.addEventListener("keydown", (ev) => {
    if (ev.target === $("search")) {
      if (ev.key === "Enter") runSearch();
      if (ev.key === "Escape") { $("search").value = ""; runSearch(); $("search").blur(); }
      return;
    }
    const k = ev.key;
    if (k === "/") { ev.preventDefault(); $("search").focus(); return; }
    if (k === "+" || k === "=") return zoom(1 / 1.25);
    if (k === "-") return zoom(1.25);
    if (k === "0") return fit(false);
    if (!selected) { if (order.length && k.startsWith("Arrow")) select(order[0]); return; }
    const moves = { ArrowDown: "down", ArrowUp: "up", ArrowRight: "next", ArrowLeft: "prev", j: "next", k: "prev" };
    if (moves[k]) { ev.preventDefault(); select(neighbour(selected, moves[k])); return; }
    const idx = +selected.slice(1);
    if (k === "Enter" && selected[0] === "g") { toggle(idx, true); select(selected); }
    if (k === "Backspace" || k === "c") {
      const g = selected[0] === "g" ? G[idx].up : N[idx].g;
      if (g > 0) { toggle(g, false); select("g" + g); }
    }
    if (k === "Escape") { selected = null; applyMarks(); $("panel-body").replaceChildren(el("p", { class: "hint" }, "Click a node for its details.")); }
  });
  function runSearch() {
    const q = $("search").value.trim();
    const pts = search(q);
    matchNodes = new Set(pts.map((p) => p[1]));
    let changed = false;
    if (matchNodes.size <= 2000) for (const i of matchNodes) changed = expandTo(i) || changed;
    if (changed) render(); else applyMarks();
    if (matchNodes.size) reveal(rep(Math.min(...matchNodes)), true);
    $("search-count").textContent = q ? `${pts.length} point${pts.length === 1 ? "" : "s"} match (${matchNodes.size} node${matchNodes.size === 1 ? "" : "s"})` : "";
    $("search-count").setAttribute("data-points", String(pts.length));
    $("search-count").setAttribute("data-nodes", String(matchNodes.size));
  }

  // -- side panel ---------------------------------------------------------------------------
  function row(t, k, v) {
    if (v === undefined || v === null || v === "") return;
    const tr = el("tr");
    tr.append(el("th", {}, k), el("td", { "data-key": k }, typeof v === "number" ? fmt(v) : String(v)));
    t.appendChild(tr);
  }
  function showPanel(id) {
    const body = $("panel-body"), k = +id.slice(1);
    const parts = [];
    const t = el("table", { class: "meta" });
    if (id[0] === "g") {
      const g = G[k];
      parts.push(el("h2", {}, g.p || "(root)"));
      row(t, "module type", g.t); row(t, "parameters", g.pa); row(t, "nodes", groupSize[k]);
      let fl = 0; N.forEach((n, i) => { if (anc[n.g].includes(k) && n.fl) fl += n.fl; });
      row(t, "FLOPs", fl);
      if (outNode[k] >= 0) row(t, "output", N[outNode[k]].s);
      parts.push(t);
      const b = el("button", { id: "toggle-group" }, expanded.has(k) ? "collapse" : "expand");
      b.addEventListener("click", () => { toggle(k); select(id); });
      if (k > 0) parts.push(b);
      if (outNode[k] >= 0) { const o = el("button", {}, "show output node"); o.addEventListener("click", () => { if (expandTo(outNode[k])) render(); select("n" + outNode[k]); }); parts.push(o); }
    } else {
      const n = N[k];
      parts.push(el("h2", {}, n.n));
      row(t, "op", n.o); row(t, "kind", n.k); row(t, "module", n.m); row(t, "module type", n.mt);
      row(t, "output", n.s); row(t, "dtype", n.dt); row(t, "source", n.src); row(t, "code", n.code);
      row(t, "FLOPs", n.fl); row(t, "module parameters", n.pa); row(t, "also named", (n.al || []).join(", "));
      row(t, "inputs", n.in.map((x) => N[x[0]].n).join(", "));
      row(t, "saved", n.sv || STATS[k] ? "yes" : "no");
      parts.push(t);
      if (STATS[k]) parts.push(...statsBlock(STATS[k]));
      if (DIFF && DIFF.rows[k]) parts.push(diffBlock(DIFF.rows[k]));
      if (k === firstDiv) parts.push(pathBlock());
    }
    body.replaceChildren(...parts);
  }
  const STAT_KEYS = ["mean", "std", "min", "max", "zeros", "nan", "inf"];
  function statsBlock(s) {
    const t = el("table", { class: "stats" }), head = el("tr");
    head.append(el("th", {}, "call"), ...STAT_KEYS.map((x) => el("th", {}, x === "nan" ? "NaN" : x)));
    t.appendChild(head);
    for (const c of s.calls) {
      const tr = el("tr", { "data-call": c.c });
      tr.appendChild(el("td", {}, String(c.c)));
      for (const x of STAT_KEYS) {
        const td = el("td", { "data-stat": x, "data-value": String(c[x]) }, fmt(c[x]));
        if ((x === "nan" || x === "inf") && c[x]) td.className = "bad";
        tr.appendChild(td);
      }
      t.appendChild(tr);
    }
    const wrap = el("div", { class: "scroll" });
    wrap.appendChild(t);
    const out = [el("h3", { class: "stats-title" }, `statistics (${s.names.join(", ")}): ${s.calls[0].dtype}[${s.calls[0].shape.join(",")}]`), wrap];
    s.calls.slice(0, 6).forEach((c) => out.push(histogram(c)));
    return out;
  }
  function histogram(c) {
    const [lo, hi, counts] = c.hist, W = 300, H = 70;
    const box = el("div", { class: "hist" });
    box.appendChild(el("div", { class: "hist-title" }, `call ${c.c}: histogram of finite values`));
    if (!counts.length) { box.appendChild(el("div", { class: "bad" }, "no finite value")); return box; }
    const s = el("svg", { width: W, height: H + 14, viewBox: `0 0 ${W} ${H + 14}` }, undefined, true);
    const top = Math.max(...counts, 1), bw = W / counts.length;
    counts.forEach((v, j) => s.appendChild(el("rect", { x: j * bw + 0.5, y: H - (v / top) * H, width: bw - 1, height: (v / top) * H }, undefined, true)));
    s.appendChild(el("text", { x: 0, y: H + 12 }, fmt(lo), true));
    s.appendChild(el("text", { x: W, y: H + 12, "text-anchor": "end" }, fmt(hi), true));
    box.appendChild(s);
    return box;
  }
  function diffBlock(rows) {
    const t = el("table", { class: "diff" }), head = el("tr");
    head.append(...["call", "status", "max abs", "max rel", "exceeding"].map((x) => el("th", {}, x)));
    t.appendChild(head);
    for (const r of rows) {
      const tr = el("tr", { class: r.diverges ? "bad" : "" });
      tr.append(el("td", {}, String(r.c)), el("td", {}, r.status), el("td", { "data-stat": "abs" }, fmt(r.abs)),
        el("td", { "data-stat": "rel" }, fmt(r.rel)), el("td", {}, `${fmt(r.exceeding)} / ${fmt(r.size)}`));
      t.appendChild(tr);
    }
    return t;
  }
  function pathBlock() {
    const box = el("div", { class: "path" });
    box.appendChild(el("h3", {}, "first divergence: path from the input"));
    const ol = el("ol");
    for (const i of DIFF.path) {
      const li = el("li", {}, N[i].n);
      li.addEventListener("click", () => { if (expandTo(i)) render(); select("n" + i); });
      ol.appendChild(li);
    }
    box.appendChild(ol);
    return box;
  }

  // -- start --------------------------------------------------------------------------------
  const colourBy = $("colour-by");
  for (const [key, [label]] of Object.entries(METRICS)) {
    const usable = key === "rel" || key === "abs" ? !!DIFF : Object.keys(STATS).length > 0;
    if (usable) colourBy.appendChild(el("option", { value: key }, label));
  }
  colourBy.addEventListener("change", () => { metric = colourBy.value; computeMetric(); if (!metric) $("legend").textContent = ""; applyMarks(); });
  $("search").addEventListener("input", () => { if (!$("search").value) runSearch(); });
  $("search-go").addEventListener("click", runSearch);
  $("fit").addEventListener("click", () => fit(false));
  $("zoom-in").addEventListener("click", () => zoom(1 / 1.25));
  $("zoom-out").addEventListener("click", () => zoom(1.25));
  $("collapse-all").addEventListener("click", () => { expanded.clear(); expanded.add(0); render(); fit(true); });
  $("title").textContent = D.title;
  $("subtitle").textContent = `${D.frontend} · ${N.length.toLocaleString("en-US")} nodes`;
  if (D.note) { $("note").textContent = D.note; $("note").hidden = false; }
  if (DIFF) {
    const s = $("diff-summary");
    s.textContent = DIFF.summary;
    s.hidden = false;
    if (firstDiv >= 0) {
      const b = el("button", { id: "goto-first" }, "go to first divergence");
      b.addEventListener("click", () => select(rep(firstDiv)));
      s.appendChild(b);
      expandTo(firstDiv);
      for (const i of DIFF.path) expandTo(i);
    }
  }
  if (Object.values(STATS).some((s) => s.calls.some((c) => c.nan || c.inf))) { colourBy.value = "nonfinite"; metric = "nonfinite"; computeMetric(); }
  else if (DIFF && METRICS.rel) { colourBy.value = "rel"; metric = "rel"; computeMetric(); }
  render();
  fit(true);
  if (firstDiv >= 0) select(rep(firstDiv));
  window.clouseauExplorer = {
    renderMs: performance.now(), layoutMs,
    show: (name) => {  // centre the view on a node (expanding its groups) or a group
      const hit = D.points.find((x) => x[0] === name), i = hit ? hit[1] : N.findIndex((n) => n.n === name);
      const id = i >= 0 ? (expandTo(i) && render(), rep(i)) : byPath.has(name) ? "g" + byPath.get(name) : null;
      if (id) reveal(id, true);
      return id;
    },
    search: (q) => { $("search").value = q; runSearch(); },
    globMatches: (pat, name, op, alias) => (pat.includes(".") ? fnmatch(name, pat) : fnmatch(name.slice(name.lastIndexOf(".") + 1), pat) || (!alias && fnmatch(op, pat))),
    expand: (path) => toggle(byPath.get(path), true),
    collapse: (path) => toggle(byPath.get(path), false),
  };
  document.body.setAttribute("data-ready", "1");
})();
