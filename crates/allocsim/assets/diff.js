// allocsim diff --html: run A's and run B's timelines, one uPlot panel each, on one scale of
// bytes (and of ops), so that the taller is taller. Sets body[data-status] to "ready" when done
// (common.js flags errors).
(function () {
  "use strict";
  const { size } = allocsim;
  const data = JSON.parse(document.getElementById("data").textContent);
  const host = document.getElementById("timelines");
  const runs = [
    { name: "A", color: "#d62728", side: data.diff.a, t: data.timelines[0] },
    { name: "B", color: "#2ca02c", side: data.diff.b, t: data.timelines[1] },
  ];
  const lastOp = Math.max(1, ...runs.map((r) => r.t.op[r.t.op.length - 1] || 0));
  const top = Math.max(1, ...runs.map((r) => Math.max(0, ...r.t.reserved)));
  for (const r of runs) {
    const title = document.createElement("div");
    title.className = "panel-title";
    title.textContent = `${r.name}: ${r.side.trace}, ${r.side.policy} (settings "${r.side.alloc_conf}"): peak reserved ${size(r.side.peak_reserved_bytes)}, ${r.side.ooms} OOMs`;
    host.appendChild(title);
    const div = document.createElement("div");
    host.appendChild(div);
    new uPlot({
      width: Math.min(1060, Math.max(600, window.innerWidth - 60)),
      height: 200,
      legend: { show: false },
      cursor: { drag: { x: true, y: false }, points: { show: false } },
      scales: {
        x: { time: false, range: [0, lastOp + Math.max(1, lastOp / 100)] },
        y: { range: [0, top * 1.05] },
      },
      series: [
        {},
        { label: "reserved", stroke: r.color, width: 1.5 },
        { label: "allocated", stroke: "#222", width: 1, dash: [4, 3] },
      ],
      axes: [
        { stroke: "#333", label: "op" },
        { stroke: "#333", size: 80, values: (u, vals) => vals.map(size) },
      ],
      hooks: { draw: [allocsim.oomMarks(r.t.ooms)] },
    }, [r.t.op, r.t.reserved, r.t.allocated], div);
  }
  document.body.dataset.status = "ready";
})();
