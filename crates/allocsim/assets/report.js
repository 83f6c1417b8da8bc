// allocsim report: draws the page's data (the JSON in #data, written by `allocsim report`).
// The timeline is uPlot's (axes, zoom, cursor); the per-allocation bands, the marks and the
// segment map are drawn here on canvases. Sets body[data-status] to "ready" when done, which
// the browser test reads (common.js flags errors).
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("data").textContent);
  const T = D.timeline;
  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;").replace(/'/g, "&#39;");

  const { size, OOM_COLOR } = allocsim;
  const palette = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#bcbd22", "#ff9896", "#98df8a", "#c5b0d5", "#c49c94", "#aec7e8", "#dbdb8d", "#9edae5"];

  $("about").innerHTML =
    `${esc(D.ops)} ops replayed under <b>${esc(D.policy)}</b>` +
    (D.alloc_conf ? ` with <code>${esc(D.alloc_conf)}</code>` : " (default settings)") +
    ` on the ${D.device === "recorded" ? "device that follows the recording" : "modelled device"}` +
    ` (${size(D.device_total)} total, ${size(D.device_free)} free at the start).` +
    (D.start_note ? ` ${esc(D.start_note[0].toUpperCase() + D.start_note.slice(1))}.` : "");

  // Each drawn allocation: [start op, end op or null, size, address, stream, pool, stack,
  // before, [compile_context, user_metadata] or null].
  const n = T.op.length;
  const lowerBound = (op) => { // first column whose op is >= op
    let lo = 0, hi = n;
    while (lo < hi) { const m = (lo + hi) >> 1; if (T.op[m] < op) lo = m + 1; else hi = m; }
    return lo;
  };
  const bands = T.bands.map((b, i) => ({
    start: b[0], end: b[1] === null ? Infinity : b[1], size: b[2], addr: b[3], stream: b[4],
    pool: b[5], stack: b[6], before: b[7], note: b[8], color: palette[i % palette.length],
    from: lowerBound(b[0]), to: b[1] === null ? n : lowerBound(b[1]),
  }));

  // The stack of column k, bottom up: the "other" band, then the drawn bands alive there.
  function stackAt(k, visit) {
    let off = T.other[k];
    for (const b of bands) {
      if (b.from <= k && k < b.to) { visit(b, off); off += b.size; }
    }
  }

  function drawBands(u) {
    const ctx = u.ctx;
    const [i0, i1] = [Math.max(0, u.series[0].idxs[0] - 1), Math.min(n - 1, u.series[0].idxs[1] + 1)];
    const x = (k) => Math.round(u.valToPos(k < n ? T.op[k] : T.op[n - 1] + T.ops_per_column, "x", true));
    const y = (v) => u.valToPos(v, "y", true);
    ctx.save();
    ctx.beginPath();
    ctx.rect(u.bbox.left, u.bbox.top, u.bbox.width, u.bbox.height);
    ctx.clip();
    ctx.fillStyle = "#cfcfcf";
    for (let k = i0; k <= i1; k++) {
      ctx.fillRect(x(k), y(T.other[k]), Math.max(1, x(k + 1) - x(k)), y(0) - y(T.other[k]));
    }
    for (let k = i0; k <= i1; k++) {
      const x0 = x(k), w = Math.max(1, x(k + 1) - x0);
      stackAt(k, (b, off) => {
        ctx.fillStyle = b.color;
        const top = y(off + b.size);
        ctx.fillRect(x0, top, w, Math.max(1, y(off) - top));
      });
    }
    // OOMs (magenta) and empty_cache calls (grey, dashed).
    const mark = (op, color, dash) => {
      // Whole pixels, inside the plot: a mark at the last op stays visible.
      const px = Math.min(Math.round(u.valToPos(op, "x", true)), u.bbox.left + u.bbox.width - 2);
      ctx.fillStyle = color;
      for (let y0 = u.bbox.top; y0 < u.bbox.top + u.bbox.height; y0 += dash[0] + dash[1]) {
        ctx.fillRect(px, y0, 2, Math.min(dash[0], u.bbox.top + u.bbox.height - y0));
      }
    };
    for (const op of D.empty_caches) mark(op, "#777", [4, 3]);
    // Few OOMs: a line each; many: a tick each along the top, so the bands stay visible.
    const tall = D.ooms.length <= 20 ? u.bbox.height : 10;
    for (const [op] of D.ooms) mark(op, OOM_COLOR, [tall, u.bbox.height]);
    ctx.restore();
  }

  const tip = $("tip");
  function hover(u) {
    const k = u.cursor.idx;
    if (k === null || k === undefined || u.cursor.left < 0) { tip.style.display = "none"; return; }
    const bytes = u.posToVal(u.cursor.top, "y");
    const t = T.time_us[k] === null ? "" : ` (${(T.time_us[k] / 1e6).toFixed(3)} s in)`;
    let text = `op ${T.op[k]}${t}: allocated ${size(T.allocated[k])}, reserved ${size(T.reserved[k])}`;
    if (bytes >= 0 && bytes < T.other[k]) {
      text += `<br>grey: ${size(T.other[k])} in allocations not drawn one by one`;
    }
    stackAt(k, (b, off) => {
      if (bytes >= off && bytes < off + b.size) {
        const ended = b.end === Infinity ? "still allocated at the end" : `freed at op ${b.end}`;
        const from = b.before ? "allocated before the history began" : `allocated at op ${b.start}`;
        text += `<br><b>${size(b.size)}</b> at 0x${b.addr.toString(16)}: ${from}, ${ended};` +
          ` stream ${b.stream}, ${b.pool.replace("_", " ")}`;
        if (b.note) {
          const [context, metadata] = b.note;
          if (context !== "N/A") text += `<br>compile context: ${esc(context)}`;
          if (metadata) text += `<br>user metadata: ${esc(metadata)}`;
        }
        if (b.stack !== null) text += "<br>" + T.frames[b.stack].map(esc).join("<br>");
      }
    });
    tip.innerHTML = text;
    tip.style.display = "block";
    const r = u.over.getBoundingClientRect();
    tip.style.left = `${window.scrollX + r.left + u.cursor.left + 14}px`;
    tip.style.top = `${window.scrollY + r.top + u.cursor.top + 14}px`;
  }

  const plot = new uPlot({
    width: Math.min(1400, Math.max(700, window.innerWidth - 40)),
    height: 420,
    cursor: { drag: { x: true, y: false }, points: { show: false } },
    // A little room after the last op, where an OOM often is.
    scales: { x: { time: false, range: (u, lo, hi) => [lo, hi + Math.max(1, (hi - lo) / 100)] } },
    legend: { show: true },
    series: [
      { label: "op" },
      { label: "allocated", stroke: "#1f4e79", width: 1, value: (u, v) => size(v) },
      { label: "reserved", stroke: "#d62728", width: 1.5, value: (u, v) => size(v) },
    ],
    axes: [
      { label: "op", stroke: "#333" },
      { label: "memory", stroke: "#333", size: 80, values: (u, vals) => vals.map(size) },
    ],
    hooks: { drawClear: [drawBands], setCursor: [hover] },
  }, [T.op, T.allocated, T.reserved], $("timeline"));

  // The wheel zooms around the cursor; with Shift it pans. (Dragging selects a range to zoom
  // to, double-click shows everything: uPlot's own.)
  plot.over.addEventListener("wheel", (e) => {
    e.preventDefault();
    const { min, max } = plot.scales.x;
    const [lo, hi] = [T.op[0], T.op[n - 1] + T.ops_per_column];
    const span = max - min;
    let [a, b] = [min, max];
    if (e.shiftKey) {
      const shift = span * 0.1 * Math.sign(e.deltaY || e.deltaX);
      [a, b] = [min + shift, max + shift];
    } else {
      const at = plot.posToVal(e.offsetX, "x");
      const f = e.deltaY < 0 ? 0.8 : 1.25;
      [a, b] = [at - (at - min) * f, at + (max - at) * f];
    }
    if (b - a > hi - lo) [a, b] = [lo, hi];
    if (a < lo) [a, b] = [lo, lo + (b - a)];
    if (b > hi) [a, b] = [hi - (b - a), hi];
    plot.setScale("x", { min: a, max: b });
  }, { passive: false });

  const drawnBytes = bands.length;
  $("timeline-note").textContent =
    `${T.allocations} allocations; the ${drawnBytes} that matter most (size times lifetime) are ` +
    `drawn one by one, the rest as the grey band. ` +
    (T.ops_per_column > 1
      ? `Downsampled: each of the ${n} columns covers ${T.ops_per_column} ops and shows the ` +
        `state at the op where allocated memory peaks within it; reserved is the most within it.`
      : `Every op is a column.`);

  const marks = [];
  D.explained.forEach((o, i) => marks.push(`<a href="#oom-${i}">OOM at op ${o.op} (${size(D.ooms[i][1])})</a>`));
  if (D.ooms.length > D.explained.length) {
    marks.push(`${D.ooms.length - D.explained.length} more OOMs (\`allocsim explain-oom --limit ${D.ooms.length}\` explains them all)`);
  }
  if (D.empty_caches.length) marks.push(`${D.empty_caches.length} empty_cache calls (grey dashed lines)`);
  $("marks").innerHTML = marks.length ? "Marks (OOMs magenta): " + marks.join(" &middot; ") : "No OOM and no empty_cache call.";
  $("oom-list").innerHTML = D.explained.length
    ? "<h2>OOMs</h2>" + D.explained.map((o, i) => `<h3 id="oom-${i}">OOM at op ${o.op}</h3><pre>${esc(o.text)}</pre>`).join("")
    : "";

  // The segment map at the chosen point.
  const canvas = $("segments"), slider = $("at"), segTip = $("seg-tip");
  const colors = ["#1f77b4", "#ff7f0e", "#dddddd"];
  const states = ["allocated", "freed, waiting for its stream", "cached free"];
  let rects = [];
  function drawSegments(i) {
    const [op, label, segs] = D.snapshots[i];
    const total = segs.reduce((s, g) => s + g[1], 0);
    $("at-label").textContent = `after op ${op}${label ? " (" + label + ")" : ""}: ` +
      `${segs.length} segments, ${size(total)} reserved`;
    const W = canvas.width - 20, gap = 4, line = 16;
    const largest = segs.reduce((m, g) => Math.max(m, g[1]), 1);
    const perLine = Math.max(largest, total / 24);
    let x = 10, yy = 4;
    const layout = segs.map((g) => {
      const w = Math.max(2, (g[1] / perLine) * W);
      if (x + w > W + 10 && x > 10) { x = 10; yy += line; }
      const r = { x, y: yy, w, g };
      x += w + gap;
      return r;
    });
    canvas.height = yy + line + 4;
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    rects = [];
    for (const r of layout) {
      const [addr, bytes, , , blocks] = r.g;
      for (const [off, sz, st] of blocks) {
        const bx = r.x + (off / bytes) * r.w, bw = Math.max(0.5, (sz / bytes) * r.w);
        ctx.fillStyle = colors[st];
        ctx.fillRect(bx, r.y, bw, line - 5);
        rects.push({ x: bx, y: r.y, w: bw, addr: addr + off, sz, st, seg: r.g });
      }
      ctx.strokeStyle = "#555";
      ctx.strokeRect(r.x, r.y, r.w, line - 5);
    }
  }
  canvas.addEventListener("mousemove", (e) => {
    const b = canvas.getBoundingClientRect();
    const mx = (e.clientX - b.left) * (canvas.width / b.width), my = e.clientY - b.top;
    const hit = rects.find((r) => mx >= r.x && mx < r.x + Math.max(r.w, 1) && my >= r.y && my < r.y + 11);
    segTip.textContent = hit
      ? `${states[hit.st]}: ${size(hit.sz)} at 0x${hit.addr.toString(16)}, in the ` +
        `${size(hit.seg[1])} segment at 0x${hit.seg[0].toString(16)} (stream ${hit.seg[2]}, ${hit.seg[3].replace("_", " ")})`
      : "";
  });
  $("at-note").textContent = D.map_every === 1
    ? `The map is kept after every op (${D.snapshots.length}).`
    : `Downsampled: the map is kept after every ${D.map_every}th op, at the reserved peak and ` +
      `at the first OOMs (${D.snapshots.length} maps).`;
  if (D.snapshots.length) {
    slider.max = D.snapshots.length - 1;
    const peak = D.snapshots.findIndex((s) => s[1] === "reserved peak");
    slider.value = peak >= 0 ? peak : D.snapshots.length - 1;
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
  }
  $("summary").textContent = D.summary;
  // `#selftest`: hover over the middle of the chart and leave what the tooltip says on the
  // body, for the browser test.
  // uPlot lays the chart out after this script: hover once it has.
  setTimeout(() => {
    if (location.hash === "#selftest") {
      const r = plot.over.getBoundingClientRect();
      plot.setCursor({ left: r.width / 2, top: r.height * 0.9 });
      document.body.dataset.hover = tip.textContent;
    }
    document.body.dataset.status = "ready";
  }, 0);
})();
