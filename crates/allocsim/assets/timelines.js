// Timelines one under the other: `diff --html`'s runs A and B, a job report's ranks. One uPlot
// panel each (reserved solid in the panel's colour, allocated dashed, OOMs marked) on one x
// range and one scale of bytes, so that the taller is taller; a zoom (drag, the wheel), a pan
// (Shift and the wheel) or a zoom out (double-click) in one panel is every panel's. Reads
// `timelines` of the page's data: {x: "op" | "time_us", x_label, panels: [{label, color, x,
// allocated, reserved, ooms}]}, written by html.rs (`timelines`, `timeline_panel`). Sets body[data-status] to "ready" when done (common.js
// flags errors), with each panel's x range in body[data-ranges] and the range they share
// unzoomed in body[data-full], for the browser test; `#selftest-zoom` first zooms the first
// panel into the middle half of that range, then pans the last a tenth of that on.
(function () {
  "use strict";
  const { size } = allocsim;
  const T = JSON.parse(document.getElementById("data").textContent).timelines;
  const host = document.getElementById("timelines");
  const most = (arr, from) => arr.reduce((a, b) => Math.max(a, b), from);
  const lastX = T.panels.reduce((m, p) => most(p.ooms, Math.max(m, p.x[p.x.length - 1] || 0)), 1);
  const full = [0, lastX + Math.max(1, lastX / 100)];
  const top = T.panels.reduce((m, p) => most(p.reserved, m), 1);
  const timed = T.x === "time_us";
  const plots = [];
  // Another panel's zoom, being applied here: not passed on again.
  let syncing = false;
  const follow = (u, key) => {
    if (key !== "x" || syncing) return;
    syncing = true;
    const { min, max } = u.scales.x;
    for (const p of plots) if (p !== u) p.setScale("x", { min, max });
    syncing = false;
  };
  const width = Math.min(1060, Math.max(600, window.innerWidth - 60));
  for (const p of T.panels) {
    const title = document.createElement("div");
    title.className = "panel-title";
    title.textContent = p.label;
    host.appendChild(title);
    const div = document.createElement("div");
    host.appendChild(div);
    plots.push(new uPlot({
      width,
      height: 200,
      legend: { show: false },
      // uPlot's own double-click would zoom out to the panel's data; ours, below, to the
      // range every panel shares.
      cursor: { drag: { x: true, y: false }, points: { show: false }, bind: { dblclick: () => null } },
      // The range asked for (a static one would undo every zoom).
      scales: { x: { time: false, range: (u, min, max) => [min, max] }, y: { range: [0, top * 1.05] } },
      series: [
        {},
        { label: "reserved", stroke: p.color, width: 1.5 },
        { label: "allocated", stroke: "#222", width: 1, dash: [4, 3] },
      ],
      axes: [
        { stroke: "#333", label: T.x_label,
          values: (u, vals, axis, space, incr) => vals.map((v) => timed
            ? (v / 1e6).toFixed(Math.min(6, Math.max(0, Math.ceil(-Math.log10(incr / 1e6))))) : v) },
        { stroke: "#333", size: 80, values: (u, vals) => vals.map(allocsim.tick) },
      ],
      hooks: { draw: [allocsim.oomMarks(p.ooms)], setScale: [follow] },
    }, [p.x, p.reserved, p.allocated], div));
  }
  // The wheel zooms around the cursor; with Shift it pans; within the shared range.
  const wheel = (u, e) => {
    e.preventDefault();
    const { min, max } = u.scales.x, span = max - min;
    let a, b;
    if (e.shiftKey) {
      const step = span * 0.1 * Math.sign(e.deltaY || e.deltaX);
      [a, b] = [min + step, max + step];
    } else {
      const at = u.posToVal(e.offsetX, "x"), f = e.deltaY < 0 ? 0.8 : 1.25;
      [a, b] = [at - (at - min) * f, at + (max - at) * f];
    }
    const w = Math.min(b - a, full[1] - full[0]);
    a = Math.max(full[0], Math.min(a, full[1] - w));
    u.setScale("x", { min: a, max: a + w });
  };
  for (const u of plots) {
    u.setScale("x", { min: full[0], max: full[1] });
    u.over.addEventListener("dblclick", () => u.setScale("x", { min: full[0], max: full[1] }));
    u.over.addEventListener("wheel", (e) => wheel(u, e), { passive: false });
  }
  document.body.dataset.panels = plots.length;
  // uPlot applies a new scale after this script's task: read the ranges in the next one.
  const selftest = location.hash === "#selftest-zoom" && plots.length;
  setTimeout(() => {
    if (selftest) {
      const q = (full[1] - full[0]) / 4;
      plots[0].setScale("x", { min: full[0] + q, max: full[1] - q });
      // Then a pan (Shift and the wheel) in the last panel: a tenth of the view on.
      const pan = new WheelEvent("wheel", { deltaY: 100, shiftKey: true, cancelable: true });
      setTimeout(() => plots[plots.length - 1].over.dispatchEvent(pan), 0);
    }
    setTimeout(() => setTimeout(() => {
      document.body.dataset.full = `${full[0]} ${full[1]}`;
      document.body.dataset.ranges = plots.map((u) => `${u.scales.x.min} ${u.scales.x.max}`).join(";");
      document.body.dataset.status = "ready";
    }, 0), 0);
  }, 0);
})();
