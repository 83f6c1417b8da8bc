// Shared by `allocsim report`, `compare --html` and `diff --html`: the error flag the browser
// tests read (body[data-errors]), sizes as memory_viz writes them, the OOM marks' colour (one
// no band, line or grid uses; the browser tests count it) and a timeline's OOM marks.
window.addEventListener("error", (e) => {
  const seen = document.body.dataset.errors;
  document.body.dataset.errors = (seen ? seen + " | " : "") + String(e.message);
});
const allocsim = {
  size(b) {
    if (b === null || b === undefined) return "-";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let v = b, u = 0;
    while (Math.abs(v) >= 1024 && u < units.length - 1) { v /= 1024; u++; }
    return u === 0 ? `${b} B` : `${v.toFixed(2)} ${units[u]}`;
  },
  OOM_COLOR: "#c800c8",
  // A uPlot draw hook marking each OOM's op: the plot's height for a few, short ticks for many.
  oomMarks(ooms) {
    return (u) => {
      const ctx = u.ctx;
      ctx.fillStyle = allocsim.OOM_COLOR;
      const tall = ooms.length <= 20 ? u.bbox.height : 8;
      for (const op of ooms) {
        const x = Math.min(Math.round(u.valToPos(op, "x", true)), u.bbox.left + u.bbox.width - 2);
        ctx.fillRect(x, u.bbox.top, 2, tall);
      }
    };
  },
};
