// attngeom browser view, part 1: the data (reports/view/page.py wraps both parts in one function
// of the view's root element). No libraries, no network: the data are in the page
// (script.ag-meta: JSON; script.ag-blob: one base64 deflated blob per sequence of
// byte-shuffled float16 arrays, decoded when first shown).
var meta = JSON.parse(root.querySelector("script.ag-meta").textContent);
var blobs = root.querySelectorAll("script.ag-blob");
var L = meta.layers.length, H = meta.heads.length, K = meta.sink_k, W = meta.tail_w;
var compact = meta.mode === "compact";
var names = {};
meta.sequences[0].index.forEach(function (e) { names[e.name] = true; });
var state = {seq: meta.initial.sequence, layer: meta.initial.layer, head: meta.initial.head,
             query: meta.initial.query, a: "alpha", b: names.contribution ? "contribution" : "alpha",
             heat: "alpha", map: "sink_rate", scope: "sequence"};
var cache = {}, arrays = null;

// ------------------------------------------------------------------ decoding
var F16 = null;
function f16() {
  if (F16) return F16;
  F16 = new Float32Array(65536);
  for (var w = 0; w < 65536; w++) {
    var e = (w >> 10) & 31, m = w & 1023;
    var v = e === 0 ? m * Math.pow(2, -24) : e === 31 ? (m ? NaN : Infinity)
      : (1 + m / 1024) * Math.pow(2, e - 15);
    F16[w] = (w & 32768) ? -v : v;
  }
  return F16;
}
function base64(text) {
  var bin = atob(text.trim()), out = new Uint8Array(bin.length);
  for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}
function inflate(bytes) {
  if (typeof DecompressionStream === "undefined") {
    return Promise.reject(new Error("this browser lacks DecompressionStream " +
                                    "(use a current Chromium, Firefox or Safari)"));
  }
  var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
  return new Response(stream).arrayBuffer().then(function (b) { return new Uint8Array(b); });
}
function load(s) {
  if (cache[s]) return Promise.resolve(cache[s]);
  return inflate(base64(blobs[s].textContent)).then(function (raw) {
    var table = f16(), out = {};
    meta.sequences[s].index.forEach(function (e) {
      var n = e.size, o = e.offset, a = new Float32Array(n), i;
      if (e.dtype === "f32") {        // four byte planes, little-endian
        var view = new DataView(new ArrayBuffer(4));
        for (i = 0; i < n; i++) {
          for (var b = 0; b < 4; b++) view.setUint8(b, raw[o + b * n + i]);
          a[i] = view.getFloat32(0, true);
        }
      } else {
        for (i = 0; i < n; i++) {
          var w = raw[o + i] | (raw[o + n + i] << 8);
          a[i] = e.dtype === "u16" ? (w === 65535 ? NaN : w) : table[w];
        }
      }
      out[e.name] = {data: a, shape: e.shape};
    });
    cache[s] = out;
    return out;
  });
}
function get(name, idx) {            // undefined: the variable is not in this view
  var a = arrays[name];
  if (!a) return undefined;
  var off = 0;
  for (var d = 0; d < idx.length; d++) off = off * a.shape[d] + idx[d];
  return a.data[off];
}

// ------------------------------------------------------------------ what a key shows
var SYMBOL = meta.symbols;          // the metric registry's symbols (store/format/metrics.py)
var METRICS = {
  alpha: {label: SYMBOL.attention, total: SYMBOL.attention + " (mean over heads)", kind: "prob",
          needs: ["alpha"]},
  contribution: {label: SYMBOL.contribution,
                 total: SYMBOL.contribution_layer + " = Σ_h " + SYMBOL.contribution_layer + "^h",
                 kind: "signed", needs: ["contribution"]},
  value_weighted: {label: SYMBOL.value_weighted, kind: "pos", needs: ["alpha", "value_norm"]},
  cosine: {label: "cos(o, ṽ)", kind: "cos", needs: ["cosine"]},
  value_norm: {label: "‖ṽ‖", kind: "norm", needs: ["value_norm"]}
};
function isTotal() { return state.head < 0; }
function usable(m) {
  if (isTotal() && !METRICS[m].total) return false;
  return METRICS[m].needs.every(function (n) { return names[n]; });
}
function metricLabel(m) { return isTotal() ? METRICS[m].total : METRICS[m].label; }
function slot(i, j) {                // where the store keeps (query i, key j)
  if (!compact || j < K) return {prefix: "", index: j, group: compact ? "sink" : "key"};
  var lag = i - j;
  if (lag >= 0 && lag < W) return {prefix: "tail_", index: lag, group: "tail"};
  return null;                       // a middle key: only the group's total is stored
}
function pairValue(m, i, j) {        // number, NaN (masked) or null (not stored)
  var s = slot(i, j);
  if (!s) return null;
  if (isTotal()) return get("total:" + s.prefix + m, [state.layer, i, s.index]);
  return get(s.prefix + m, [state.layer, state.head, i, s.index]);
}
function keyValue(m, i, j) {
  if (m === "value_norm") return get("value_norm", [state.layer, state.head, j]);
  if (m === "value_weighted") {      // value-weighted attention (store/format/derive.py)
    var a = pairValue("alpha", i, j);
    return a === null ? null : a * get("value_norm", [state.layer, state.head, j]);
  }
  return pairValue(m, i, j);
}
function middleValue(m, i) {
  if (!compact || (m !== "alpha" && m !== "contribution")) return null;
  var v = isTotal() ? get("total:middle_" + m, [state.layer, i])
    : get("middle_" + m, [state.layer, state.head, i]);
  return v === undefined ? null : v;
}
function middleCount(i) {
  var heads = isTotal() ? meta.heads.map(function (_, h) { return h; }) : [state.head], n = 0;
  heads.forEach(function (h) {
    var c = get("middle_count", [state.layer, h, i]);
    if (c > n) n = c;
  });
  return n;
}
function learnedValue(i) {
  if (!names.learned_sink_alpha) return null;
  return isTotal() ? get("total:learned_sink_alpha", [state.layer, i])
    : get("learned_sink_alpha", [state.layer, state.head, i]);
}

// ------------------------------------------------------------------ numbers and colours
var F16_NORMAL = Math.pow(2, -14), F16_STEP = Math.pow(2, -24);
function fmt(x) {                    // what float16 keeps: 3 significant digits, fewer below 2^-14
  if (x === null || x === undefined) return "not stored";
  if (isNaN(x)) return "masked";
  if (x === 0) return "0";
  var ax = Math.abs(x), digits = 3;
  if (ax < F16_NORMAL) digits = Math.max(1, Math.min(3, Math.floor(Math.log10(ax / F16_STEP))));
  return String(Number(x.toPrecision(digits)));
}
var RAMPS = {
  blues: ["#f7fbff", "#deebf7", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5",
          "#08519c", "#08306b"],
  greens: ["#f7fcf5", "#e5f5e0", "#c7e9c0", "#a1d99b", "#74c476", "#41ab5d", "#238b45",
           "#006d2c", "#00441b"],
  rdbu: ["#053061", "#2166ac", "#4393c3", "#92c5de", "#d1e5f0", "#f7f7f7", "#fddbc7",
         "#f4a582", "#d6604d", "#b2182b", "#67001f"]
};
function rgb(hex) { return [1, 3, 5].map(function (i) { return parseInt(hex.substr(i, 2), 16); }); }
function ramp(name, t) {
  var stops = RAMPS[name], x = Math.max(0, Math.min(1, t)) * (stops.length - 1);
  var i = Math.min(stops.length - 2, Math.floor(x)), f = x - i, a = rgb(stops[i]), b = rgb(stops[i + 1]);
  return [0, 1, 2].map(function (c) { return Math.round(a[c] + f * (b[c] - a[c])); });
}
function scale(kind, values) {       // -> {color(v) -> [r, g, b] | null, lo, hi, kind}
  var finite = values.filter(function (v) { return v !== null && v !== undefined && isFinite(v); });
  var top = finite.reduce(function (m, v) { return Math.max(m, Math.abs(v)); }, 0) || 1;
  var s = {kind: kind, lo: 0, hi: top};
  if (kind === "signed" || kind === "cos") {
    var lim = kind === "cos" ? 1 : top;
    s.lo = -lim; s.hi = lim;
    s.color = function (v) { return ramp("rdbu", 0.5 + v / (2 * lim)); };
  } else if (kind === "prob") {     // square-root scale, as the PDF's strips
    s.color = function (v) { return ramp("blues", Math.sqrt(Math.max(0, v) / top)); };
  } else {
    s.color = function (v) { return ramp(kind === "norm" ? "greens" : "blues", v / top); };
  }
  return s;
}
function css(c) { return "rgb(" + c.join(",") + ")"; }
function dark(c) { return 0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2] < 120; }

