// Shared by `allocsim report`, `compare --html` and `diff --html`: the error flag the browser
// tests read (body[data-errors]), sizes as memory_viz writes them, axis ticks in round binary
// units, the OOM marks' colour (one no band, line or grid uses; the browser tests count it),
// a timeline's OOM marks, and the report's compressed columns.
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
  // An axis tick: 0, 512 MiB, 1 GiB, 1.5 GiB (the value in the largest unit it reaches, with
  // no trailing zeros).
  tick(b) {
    if (!b) return "0";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let v = b, u = 0;
    while (Math.abs(v) >= 1024 && u < units.length - 1) { v /= 1024; u++; }
    return `${+v.toFixed(2)} ${units[u]}`;
  },
  OOM_COLOR: "#c800c8",
  // A uPlot draw hook marking each OOM at its x: the plot's height for up to 20 in view;
  // more, as triangles along the top, those within 24 px as one with their count, so a
  // thousand stay readable and leave the bands visible.
  oomMarks(ooms) {
    return (u) => {
      const ctx = u.ctx, { left, top, width, height } = u.bbox;
      const min = u.scales.x.min, max = u.scales.x.max;
      const xs = ooms.filter((x) => x >= min && x <= max)
        .map((x) => Math.min(Math.round(u.valToPos(x, "x", true)), left + width - 2));
      ctx.save();
      ctx.fillStyle = allocsim.OOM_COLOR;
      if (xs.length <= 20) {
        for (const x of xs) ctx.fillRect(x, top, 2, height);
        ctx.restore();
        return;
      }
      const groups = [];
      for (const x of xs) {
        const g = groups[groups.length - 1];
        if (g && x - g.x < 24 * devicePixelRatio) g.n++; else groups.push({ x, n: 1 });
      }
      const r = 5 * devicePixelRatio;
      ctx.font = `${10 * devicePixelRatio}px sans-serif`;
      ctx.textAlign = "center";
      for (const g of groups) {
        ctx.beginPath();
        ctx.moveTo(g.x - r, top);
        ctx.lineTo(g.x + r, top);
        ctx.lineTo(g.x, top + 1.6 * r);
        ctx.fill();
        if (g.n > 1) ctx.fillText(String(g.n), g.x, top + 1.6 * r + 10 * devicePixelRatio);
      }
      ctx.restore();
    };
  },
  // A table of `allocsim report`'s columns ({names, rows, lengths, data}: report/pack.rs)
  // as {name: Float64Array}: base64, inflated, LEB128 varints.
  async unpack(table) {
    const text = atob(table.data), raw = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) raw[i] = text.charCodeAt(i);
    const stream = new Blob([raw]).stream().pipeThrough(new DecompressionStream("deflate"));
    const bytes = new Uint8Array(await new Response(stream).arrayBuffer());
    const out = {};
    let at = 0;
    table.names.forEach((name, k) => {
      const col = new Float64Array(table.rows[k]);
      for (let i = 0; i < col.length; i++) {
        let v = 0, mul = 1, b;
        do { b = bytes[at++]; v += (b & 0x7f) * mul; mul *= 128; } while (b & 0x80);
        col[i] = v;
      }
      out[name] = col;
    });
    return out;
  },
};
