// Shared by `allocsim report` and `compare --html`: the error flag the browser tests read
// (body[data-errors]), sizes as memory_viz writes them, and the OOM marks' colour (one no band,
// line or grid uses; the browser tests count it).
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
};
