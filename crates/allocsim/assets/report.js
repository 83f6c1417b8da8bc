// allocsim report: draws the page's data (the JSON in #data, written by `allocsim report`).
// The timeline is uPlot's (axes, zoom, cursor); the per-allocation bands, the marks and the
// segment map are drawn here on canvases. Sets body[data-status] to "ready" when done, which
// the browser test reads (common.js flags errors).
//
// The page holds every allocation (report.rs, `timeline`), as compressed varint columns that
// it inflates first. Each view (the whole run, or the range zoomed into) is computed from them
// when it is shown: per pixel column the op where allocated memory peaks within it, the most
// reserved within it, and the state at that op: the allocations of a pixel or more one by one,
// in allocation order, over one grey band of the smaller ones. Hovering finds the allocation
// under the cursor among all of them, however small.
(async function () {
  "use strict";
  const D = JSON.parse(document.getElementById("data").textContent);
  const T = D.timeline;
  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
  const { size, OOM_COLOR, unpack } = allocsim;
  const palette = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#bcbd22", "#ff9896", "#98df8a", "#c5b0d5", "#c49c94", "#aec7e8", "#dbdb8d", "#9edae5"];
  const timed = D.x === "time_us";

  $("about").innerHTML =
    `${esc(D.ops)} ops replayed under <b>${esc(D.policy)}</b>` +
    (D.alloc_conf ? ` with <code>${esc(D.alloc_conf)}</code>` : " (default settings)") +
    ` on the ${D.device === "recorded" ? "device that follows the recording" : "modelled device"}` +
    ` (${size(D.device_total)} total, ${size(D.device_free)} free at the start).` +
    (D.start_note ? ` ${esc(D.start_note[0].toUpperCase() + D.start_note.slice(1))}.` : "");

  // Every allocation, in allocation order: ops (start, end: Infinity when alive at the end),
  // x positions (time or op), size, address, stack, note, kind (report.rs).
  const A = await unpack(T.allocations);
  const N = T.count;
  const sop = new Float64Array(N), eop = new Float64Array(N), x0 = new Float64Array(N),
    x1 = new Float64Array(N), addr = new Float64Array(N);
  {
    let s = 0, x = 0, a = 0;
    for (let i = 0; i < N; i++) {
      s += A.start[i]; sop[i] = s;
      eop[i] = A.ops[i] === 0 ? Infinity : s + A.ops[i] - 1;
      if (timed) { x += A.x0[i]; x0[i] = x; x1[i] = A.ops[i] === 0 ? Infinity : x + A.dx[i]; } else { x0[i] = s; x1[i] = eop[i]; }
      a += A.addr[i] % 2 ? -(A.addr[i] + 1) / 2 : A.addr[i] / 2; addr[i] = a;
    }
  }
  const sz = A.size;
  // The columns read into the arrays above are not kept twice (a 10 M-entry page: 130 MB).
  A.start = A.ops = A.x0 = A.dx = A.addr = null;
  // The ended allocations by end op (a counting sort: ops are integers).
  const endOrder = (() => {
    const counts = new Uint32Array(D.ops + 2);
    let ended = 0;
    for (let i = 0; i < N; i++) if (eop[i] !== Infinity) { counts[eop[i] + 1]++; ended++; }
    for (let k = 1; k < counts.length; k++) counts[k] += counts[k - 1];
    const order = new Uint32Array(ended);
    for (let i = 0; i < N; i++) if (eop[i] !== Infinity) order[counts[eop[i]]++] = i;
    return order;
  })();
  document.body.dataset.unpackedMs = Math.round(performance.now());
  // Reserved memory after each op that changed it.
  const S = await unpack(T.steps);
  const stepOp = new Float64Array(S.op.length), stepX = new Float64Array(S.op.length),
    stepBytes = new Float64Array(S.op.length);
  {
    let o = 0, x = 0, b = 0;
    for (let k = 0; k < S.op.length; k++) {
      o += S.op[k]; x += S.x[k]; b += S.bytes[k] % 2 ? -(S.bytes[k] + 1) / 2 : S.bytes[k] / 2;
      stepOp[k] = o; stepX[k] = timed ? x : o; stepBytes[k] = b;
    }
  }
  // (A reduce, not Math.max(...marks): a storm of 100,000 OOMs is too many arguments.)
  const lastX = [...D.ooms.map((o) => o[2]), ...D.empty_caches.map((e) => e[1])].reduce(
    (a, b) => Math.max(a, b), Math.max(1, stepX[stepX.length - 1] || 0,
      N ? (timed ? x0[N - 1] : sop[N - 1]) : 0, timed ? 0 : D.ops));
  const full = [0, lastX + Math.max(1, lastX / 100)];
  const firstAt = (arr, v, lo = 0, hi = arr.length) => { // first k with arr[k] >= v
    while (lo < hi) { const m = (lo + hi) >> 1; if (arr[m] < v) lo = m + 1; else hi = m; }
    return lo;
  };

  // One view: W pixel columns over [xa, xb).
  let V = null;
  function computeView(xa, xb, W, height, yRange) {
    const dx = (xb - xa) / W, col = (x) => Math.min(W - 1, Math.max(0, Math.floor((x - xa) / dx)));
    // The allocations alive at xa, and the events within the view, in op order.
    let allocated = 0, opBefore = -1;
    const iStart = firstAt(x0, xa);
    const alive = [];
    for (let i = 0; i < iStart; i++) {
      if (!(x1[i] < xa)) { allocated += sz[i]; alive.push(i); }
      opBefore = Math.max(opBefore, sop[i]);
    }
    let jEnd = 0;
    { let lo = 0, hi = endOrder.length; while (lo < hi) { const m = (lo + hi) >> 1; if (x1[endOrder[m]] < xa) lo = m + 1; else hi = m; } jEnd = lo; }
    if (jEnd > 0) opBefore = Math.max(opBefore, eop[endOrder[jEnd - 1]]);
    const events = (visit) => { // (op, x, index, +1 start / -1 end)
      let i = iStart, j = jEnd;
      for (;;) {
        const si = i < N && x0[i] < xb ? i : -1, ej = j < endOrder.length && x1[endOrder[j]] < xb ? endOrder[j] : -1;
        if (si < 0 && ej < 0) return;
        if (ej < 0 || (si >= 0 && sop[si] < eop[ej])) { visit(sop[si], x0[si], si, 1); i++; } else { visit(eop[ej], x1[ej], ej, -1); j++; }
      }
    };
    // Pass 1: per column, the op where allocated peaks and the peak; reserved's most.
    const peakOp = new Float64Array(W), alloc = new Float64Array(W);
    let c = 0, lastOp = opBefore;
    peakOp[0] = opBefore; alloc[0] = allocated;
    events((op, x, i, d) => {
      const k = col(x);
      while (c < k) { c++; peakOp[c] = lastOp; alloc[c] = allocated; }
      allocated += d * sz[i]; lastOp = op;
      if (allocated >= alloc[c]) { alloc[c] = allocated; peakOp[c] = op; }
    });
    while (c < W - 1) { c++; peakOp[c] = lastOp; alloc[c] = allocated; }
    const reserved = new Float64Array(W);
    let k = Math.max(0, firstAt(stepX, xa) - 1);
    let r = stepX[k] <= xa ? stepBytes[k] : 0;
    for (let cc = 0; cc < W; cc++) {
      const end = xa + (cc + 1) * dx;
      let most = r;
      while (k + 1 < stepX.length && stepX[k + 1] < end) { k++; r = stepBytes[k]; most = Math.max(most, r); }
      reserved[cc] = most;
    }
    let top = 1;
    for (let cc = 0; cc < W; cc++) top = Math.max(top, reserved[cc], alloc[cc]);
    const yTop = niceTop(top);
    const [ya, yb] = yRange || [0, yTop];
    const perPixel = (yb - ya) / height;
    // Pass 2: the state at each column's peak op: the grey band and the allocations drawn.
    const other = new Float64Array(W), rects = []; // rects: [column, allocation, offset]
    let small = 0, big = [];
    for (const i of alive) if (sz[i] >= perPixel) big.push(i); else small += sz[i];
    let pc = 0;
    const record = () => {
      other[pc] = small;
      let off = small;
      for (const i of big) {
        if (off + sz[i] >= ya && off <= yb) rects.push(pc, i, off);
        off += sz[i];
      }
      pc++;
    };
    events((op, x, i, d) => {
      while (pc < W && peakOp[pc] < op) record();
      if (sz[i] < perPixel) small += d * sz[i];
      else if (d > 0) big.push(i);
      else big.splice(big.lastIndexOf(i), 1);
    });
    while (pc < W) record();
    return { xa, xb, W, dx, peakOp, alloc, reserved, other, rects, ya, yb, perPixel,
      xs: Array.from({ length: W }, (_, c) => xa + c * dx) };
  }

  // The top of the y axis: a round binary step above `v` (niceStep's multiple).
  function niceStep(v) { let s = 1; while (v / s > 6) s *= 2; return s; }
  function niceTop(v) { const s = niceStep(v); return Math.ceil(v / s) * s; }

  // The state after `op`: every allocation alive, in allocation order, with its offset.
  function stateAt(op) {
    const out = [];
    let off = 0;
    for (let i = 0; i < N && sop[i] <= op; i++) {
      if (eop[i] > op) { out.push([i, off]); off += sz[i]; }
    }
    return out;
  }

  function drawBands(u) {
    if (!V) return;
    const ctx = u.ctx;
    const x = (c) => Math.round(u.valToPos(V.xa + c * V.dx, "x", true));
    const y = (v) => u.valToPos(v, "y", true);
    ctx.save();
    ctx.beginPath();
    ctx.rect(u.bbox.left, u.bbox.top, u.bbox.width, u.bbox.height);
    ctx.clip();
    ctx.fillStyle = "#cfcfcf";
    for (let c = 0; c < V.W; c++) {
      if (V.other[c] > 0) ctx.fillRect(x(c), y(V.other[c]), Math.max(1, x(c + 1) - x(c)), y(0) - y(V.other[c]));
    }
    for (let k = 0; k < V.rects.length; k += 3) {
      const c = V.rects[k], i = V.rects[k + 1], off = V.rects[k + 2];
      ctx.fillStyle = palette[i % palette.length];
      const top = y(off + sz[i]);
      ctx.fillRect(x(c), top, Math.max(1, x(c + 1) - x(c)), Math.max(1, y(off) - top));
    }
    // empty_cache calls (grey, dashed), then OOMs (magenta).
    for (const [, at] of D.empty_caches) {
      const px = Math.min(Math.round(u.valToPos(at, "x", true)), u.bbox.left + u.bbox.width - 2);
      ctx.fillStyle = "#777";
      for (let y0 = u.bbox.top; y0 < u.bbox.top + u.bbox.height; y0 += 7) ctx.fillRect(px, y0, 2, 4);
    }
    ctx.restore();
  }

  const xLabel = (v) => timed ? `${(v / 1e6).toFixed(3)} s` : `op ${Math.round(v)}`;
  const tip = $("tip");
  let hoverCache = [-1, null];
  function hover(u) {
    const c = u.cursor.idx;
    if (!V || c === null || c === undefined || u.cursor.left < 0) { tip.style.display = "none"; return; }
    const bytes = u.posToVal(u.cursor.top, "y");
    const op = V.peakOp[c];
    if (hoverCache[0] !== op) hoverCache = [op, stateAt(op)];
    const state = hoverCache[1];
    const at = timed && state.length ? ` (${(V.xa / 1e6 + c * V.dx / 1e6).toFixed(6)} s in)` : "";
    let text = `op ${op}${at}: allocated ${size(V.alloc[c])}, reserved ${size(V.reserved[c])}`;
    // The grey band stacks the small allocations at the bottom, in allocation order; the
    // drawn ones follow.
    let found = null, smallOff = 0;
    for (const [i] of state) {
      if (sz[i] >= V.perPixel) continue;
      if (bytes >= smallOff && bytes < smallOff + sz[i]) found = i;
      smallOff += sz[i];
    }
    if (found !== null) text += `<br>grey: ${size(V.other[c])} in allocations smaller than a pixel; this one:`;
    let off = smallOff;
    for (const [i] of state) {
      if (sz[i] < V.perPixel) continue;
      if (bytes >= off && bytes < off + sz[i]) found = i;
      off += sz[i];
    }
    if (found !== null) text += "<br>" + describe(found);
    tip.innerHTML = text;
    tip.style.display = "block";
    const r = u.over.getBoundingClientRect();
    tip.style.left = `${window.scrollX + r.left + u.cursor.left + 14}px`;
    tip.style.top = `${window.scrollY + r.top + u.cursor.top + 14}px`;
  }
  function describe(i) {
    const kind = A.kind[i];
    const ended = eop[i] === Infinity ? "still allocated at the end" : `freed at op ${eop[i]}`;
    const from = kind & 1 ? "allocated before the history began" : `allocated at op ${sop[i]}`;
    let text = `<b>${size(sz[i])}</b> at 0x${addr[i].toString(16)}: ${from}, ${ended};` +
      ` stream ${esc(T.streams[Math.floor(kind / 4)])}, ${kind & 2 ? "large pool" : "small pool"}`;
    if (A.note[i]) {
      const [context, metadata] = T.notes[A.note[i] - 1];
      if (context !== "N/A") text += `<br>compile context: ${esc(context)}`;
      if (metadata) text += `<br>user metadata: ${esc(metadata)}`;
    }
    if (A.stack[i]) text += "<br>" + T.stacks[A.stack[i] - 1].map((f) => esc(T.frames[f])).join("<br>");
    return text;
  }

  const width = Math.min(1400, Math.max(700, window.innerWidth - 40)), height = 420;
  let plot = null;
  function show(xa, xb, yRange) {
    const W = Math.max(50, Math.round(plot ? plot.bbox.width / devicePixelRatio : width - 100));
    const began = performance.now();
    V = computeView(xa, xb, W, plot ? plot.bbox.height / devicePixelRatio : height - 60, yRange);
    document.body.dataset.viewMs = Math.round(performance.now() - began);
    hoverCache = [-1, null];
    const drawn = new Set();
    for (let k = 1; k < V.rects.length; k += 3) drawn.add(V.rects[k]);
    $("timeline-note").textContent =
      `${N} allocations. This view: ${drawn.size} allocations of a pixel or more drawn one by ` +
      `one, the smaller ones as the grey band (hover names each; drag up the memory axis to ` +
      `zoom into them); each of the ${V.W} columns ` +
      `shows the state where allocated memory peaks within it, reserved the most within it.`;
    document.body.dataset.drawn = drawn.size;
    if (plot) plot.batch(() => {
      plot.setData([V.xs, Array.from(V.alloc), Array.from(V.reserved)], false);
      plot.setScale("x", { min: xa, max: xb });
      plot.setScale("y", { min: V.ya, max: V.yb });
    });
  }
  let shown = full;
  const axisValues = (u, vals) => vals.map((v) => allocsim.tick(v));
  plot = new uPlot({
    width, height,
    cursor: { drag: { x: true, y: true, uni: 30, setScale: false }, points: { show: false }, bind: { dblclick: () => null } },
    scales: {
      x: { time: false, range: () => shown },
      y: { range: () => V ? [V.ya, V.yb] : [0, 1] },
    },
    legend: { show: true },
    series: [
      { label: timed ? "time" : "op", value: (u, v) => v === null ? "-" : xLabel(v) },
      { label: "allocated", stroke: "#1f4e79", width: 1, value: (u, v) => size(v) },
      { label: "reserved", stroke: "#d62728", width: 1.5, value: (u, v) => size(v) },
    ],
    axes: [
      { label: timed ? "time since the first entry (s)" : "op", stroke: "#333",
        // Seconds with as many decimals as the ticks' spacing needs, down to the µs.
        values: (u, vals, axis, space, incr) => vals.map((v) => timed
          ? (v / 1e6).toFixed(Math.min(6, Math.max(0, Math.ceil(-Math.log10(incr / 1e6))))) : v) },
      { label: "memory", stroke: "#333", size: 80, values: axisValues,
        splits: (u) => {
          const { min, max } = u.scales.y, s = niceStep(max - min), out = [];
          for (let v = Math.ceil(min / s) * s; v <= max; v += s) out.push(v);
          return out;
        } },
    ],
    hooks: {
      drawClear: [drawBands],
      draw: [allocsim.oomMarks(D.ooms.map((o) => o[2]))],
      setCursor: [hover],
      // A drag along the time axis zooms into that range, one up the memory axis into those
      // bytes (where the allocations too small to draw before are drawn one by one), a
      // diagonal one into both.
      setSelect: [(u) => {
        const { left, top, width: w, height: h } = u.select;
        if (w < 2 && h < 2) return;
        u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
        const alongX = w < u.over.clientWidth - 1, alongY = h < u.over.clientHeight - 1;
        const xs = alongX ? [u.posToVal(left, "x"), u.posToVal(left + w, "x")] : shown;
        const ys = alongY ? [Math.max(0, u.posToVal(top + h, "y")), u.posToVal(top, "y")] : alongX ? null : shownY;
        zoom(xs[0], xs[1], ys);
      }],
    },
  }, [[0], [0], [0]], $("timeline"));
  let shownY = null; // the bytes shown, when zoomed into some; null: from 0 to the view's top
  function zoom(a, b, ys = null) {
    const span = full[1] - full[0];
    if (b - a > span) [a, b] = full;
    if (a < full[0]) [a, b] = [full[0], full[0] + (b - a)];
    if (b > full[1]) [a, b] = [full[1] - (b - a), full[1]];
    if (b - a < 1) b = a + 1;
    shown = [a, b];
    shownY = ys && ys[1] - ys[0] >= 1 ? ys : null;
    show(a, b, shownY);
  }
  plot.over.addEventListener("dblclick", () => zoom(...full));
  // The wheel zooms around the cursor; with Shift it pans. Dragging selects a range to zoom
  // to, double-click shows everything.
  let pending = null;
  plot.over.addEventListener("wheel", (e) => {
    e.preventDefault();
    const [min, max] = shown, span = max - min;
    let [a, b] = [min, max];
    if (e.shiftKey) {
      const step = span * 0.1 * Math.sign(e.deltaY || e.deltaX);
      [a, b] = [min + step, max + step];
    } else {
      const at = plot.posToVal(e.offsetX, "x"), f = e.deltaY < 0 ? 0.8 : 1.25;
      [a, b] = [at - (at - min) * f, at + (max - at) * f];
    }
    shown = [a, b];
    // One view a frame, however fast the wheel turns.
    if (!pending) pending = requestAnimationFrame(() => { pending = null; zoom(...shown); });
  }, { passive: false });
  zoom(...full);

  const marks = [];
  D.explained.forEach((o, i) => marks.push(`<a href="#oom-${i}">OOM at op ${o.op} (${size(D.ooms[i][1])})</a>`));
  if (D.ooms.length > D.explained.length) {
    marks.push(`${D.ooms.length - D.explained.length} more OOMs (\`allocsim explain-oom --limit ${D.ooms.length}\` explains them all)`);
  }
  if (D.empty_caches.length) marks.push(`${D.empty_caches.length} empty_cache calls (grey dashed lines)`);
  $("marks").innerHTML = marks.length ? "Marks (OOMs magenta; close ones as one, with their count): " + marks.join(" &middot; ") : "No OOM and no empty_cache call.";
  $("oom-list").innerHTML = D.explained.length
    ? "<h2>OOMs</h2>" + D.explained.map((o, i) => `<h3 id="oom-${i}">OOM at op ${o.op}</h3><pre>${esc(o.text)}</pre>`).join("")
    : "";

  // The segment maps: per map its segments, per segment its blocks (report.rs, `snapshots`).
  const M = await unpack(D.snapshots.maps);
  const segFirst = [0], blockFirst = [0], segAddr = [];
  {
    let a = 0;
    for (let m = 0; m < M.segments.length; m++) segFirst.push(segFirst[m] + M.segments[m]);
    for (let s = 0; s < (M.size || []).length; s++) {
      a += M.address[s] % 2 ? -(M.address[s] + 1) / 2 : M.address[s] / 2;
      segAddr.push(a);
      blockFirst.push(blockFirst[s] + M.blocks[s]);
    }
  }
  const canvas = $("segments"), slider = $("at"), segTip = $("seg-tip");
  const colors = ["#1f77b4", "#ff7f0e", "#dddddd"];
  const states = ["allocated", "freed, waiting for its stream", "cached free"];
  let rects = [];
  function drawSegments(m) {
    const [op, label] = D.snapshots.list[m];
    const segs = [];
    for (let s = segFirst[m]; s < segFirst[m + 1]; s++) segs.push(s);
    const total = segs.reduce((t, s) => t + M.size[s], 0);
    $("at-label").textContent = `after op ${op}${label ? " (" + label + ")" : ""}: ` +
      `${segs.length} segments, ${size(total)} reserved`;
    const W = canvas.width - 20, gap = 4, line = 16;
    const largest = segs.reduce((t, s) => Math.max(t, M.size[s]), 1);
    const perLine = Math.max(largest, total / 24);
    let x = 10, yy = 4;
    const layout = segs.map((s) => {
      const w = Math.max(2, (M.size[s] / perLine) * W);
      if (x + w > W + 10 && x > 10) { x = 10; yy += line; }
      const r = { x, y: yy, w, s };
      x += w + gap;
      return r;
    });
    canvas.height = yy + line + 4;
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    rects = [];
    for (const r of layout) {
      const bytes = M.size[r.s];
      let off = 0;
      for (let b = blockFirst[r.s]; b < blockFirst[r.s + 1]; b++) {
        off += M.gap[b];
        const sz = M.bytes[b], st = M.state[b];
        const bx = r.x + (off / bytes) * r.w, bw = Math.max(0.5, (sz / bytes) * r.w);
        ctx.fillStyle = colors[st];
        ctx.fillRect(bx, r.y, bw, line - 5);
        rects.push({ x: bx, y: r.y, w: bw, addr: segAddr[r.s] + off, sz, st, s: r.s });
        off += sz;
      }
      ctx.strokeStyle = "#555";
      ctx.strokeRect(r.x, r.y, r.w, line - 5);
    }
  }
  canvas.addEventListener("mousemove", (e) => {
    const b = canvas.getBoundingClientRect();
    const mx = (e.clientX - b.left) * (canvas.width / b.width), my = e.clientY - b.top;
    const hit = rects.find((r) => mx >= r.x && mx < r.x + Math.max(r.w, 1) && my >= r.y && my < r.y + 11);
    const kind = hit ? M.kind[hit.s] : 0;
    segTip.textContent = hit
      ? `${states[hit.st]}: ${size(hit.sz)} at 0x${hit.addr.toString(16)}, in the ` +
        `${size(M.size[hit.s])} segment at 0x${segAddr[hit.s].toString(16)} (stream ` +
        `${D.snapshots.streams[Math.floor(kind / 2)]}, ${kind & 1 ? "large pool" : "small pool"})`
      : "";
  });
  const maps = D.snapshots.list;
  $("at-note").textContent = D.map_every === 1
    ? `The map is kept after every op (${maps.length}).`
    : `Downsampled: the map is kept after every ${D.map_every}th op, at the reserved peak and ` +
      `at the first OOMs (${maps.length} maps).`;
  if (maps.length) {
    slider.max = maps.length - 1;
    const peak = maps.findIndex((s) => s[1] === "reserved peak");
    slider.value = peak >= 0 ? peak : maps.length - 1;
    slider.addEventListener("input", () => drawSegments(+slider.value));
    drawSegments(+slider.value);
  }

  if (D.advice) {
    const rows = D.advice.map((r, i) =>
      `<tr><td>${i + 1}</td><td>${size(r.peak_reserved)}</td>` +
      `<td>${r.needs === null ? "does not fit" : `${size(r.needs)} [${size(r.low)}, ${size(r.high)}]`}</td>` +
      `<td>${r.ooms}</td><td>${(100 * r.fragmentation).toFixed(1)}%</td>` +
      `<td>${(100 * r.headroom / Math.max(1, r.peak_reserved)).toFixed(1)}%</td>` +
      `<td><code>${esc(r.conf)}</code></td></tr>`);
    $("advice").innerHTML = "<h2>Settings, ranked (allocsim advise)</h2>" +
      "<table><tr><th>rank</th><th>peak reserved</th><th>free memory needed [band]</th><th>OOMs</th>" +
      "<th>fragmentation</th><th title=\"the share of peak reserved above the most bytes live at " +
      "once, in whole pages (allocsim bound)\">headroom</th><th>PYTORCH_CUDA_ALLOC_CONF</th></tr>" +
      rows.join("") + "</table>";
  } else if (D.advice_skipped) {
    $("advice").innerHTML = "<h2>Settings</h2><p class=\"hint\">Left out for a trace this long " +
      "(<code>allocsim advise</code> ranks them).</p>";
  }
  $("summary").textContent = D.summary;
  // `#selftest`: hover over the middle of the chart, halfway up the stack, and leave what the tooltip says on the
  // body, for the browser test; `#selftest-zoom` first zooms into the thousandth of the run
  // around its middle.
  // uPlot lays the chart out after this script: hover once it has.
  setTimeout(() => {
    if (location.hash.startsWith("#selftest")) {
      if (location.hash === "#selftest-zoom") {
        const mid = (full[0] + full[1]) / 2, half = (full[1] - full[0]) / 2000;
        zoom(mid - half, mid + half);
        document.body.dataset.zoom = `${shown[0]} ${shown[1]}`;
      }
      // The middle column, halfway up its allocated memory.
      const r = plot.over.getBoundingClientRect(), c = Math.floor(V.W / 2);
      plot.setCursor({ left: r.width / 2, top: plot.valToPos(V.alloc[c] / 2, "y") });
      document.body.dataset.hover = tip.textContent;
    }
    document.body.dataset.loadMs = Math.round(performance.now());
    document.body.dataset.status = "ready";
  }, 0);
})().catch((e) => { document.body.dataset.errors = String(e && e.stack || e); });
