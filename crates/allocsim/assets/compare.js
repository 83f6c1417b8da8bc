// allocsim compare --html: one uPlot panel per column of each trace, each on its own scale, so
// that a policy reserving ten times more does not squash the others into a flat line. Sets
// body[data-status] to "ready" when done (common.js flags errors).
(function () {
  "use strict";
  const { size } = allocsim;
  // Not the segment maps' blue, orange and grey.
  const colors = ["#d62728", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#bcbd22"];
  const data = JSON.parse(document.getElementById("data").textContent);
  data.forEach((trace, t) => {
    const host = document.getElementById(`trace-${t}`);
    const last = Math.max(...trace.panels.map((p) => p.op[p.op.length - 1] || 0), 1);
    trace.panels.forEach((p, i) => {
      const title = document.createElement("div");
      title.className = "panel-title";
      title.textContent = `${p.policy} (${p.device === "recorded" ? "follows the recording" : "modelled device"}): ${p.about}`;
      host.appendChild(title);
      const div = document.createElement("div");
      host.appendChild(div);
      new uPlot({
        width: Math.min(1060, Math.max(600, window.innerWidth - 60)),
        height: 170,
        legend: { show: false },
        cursor: { drag: { x: true, y: false }, points: { show: false } },
        scales: { x: { time: false, range: [0, last + Math.max(1, last / 100)] } },
        series: [
          {},
          { label: "reserved", stroke: colors[i % colors.length], width: 1.5 },
          { label: "allocated", stroke: "#222", width: 1, dash: [4, 3] },
        ],
        axes: [
          { stroke: "#333", label: i === trace.panels.length - 1 ? "op" : "" },
          { stroke: "#333", size: 80, values: (u, vals) => vals.map(size) },
        ],
        hooks: { draw: [allocsim.oomMarks(p.ooms)] },
      }, [p.op, p.reserved, p.allocated], div);
    });
  });
  document.body.dataset.status = "ready";
})();
