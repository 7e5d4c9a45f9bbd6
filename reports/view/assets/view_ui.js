// attngeom browser view, part 2: the page (controls, map, token strip, heat map, tooltip).
// ------------------------------------------------------------------ page skeleton
function el(tag, cls, text) {
  var e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}
function select(role, options, value) {
  var s = el("select");
  s.setAttribute("data-role", role);
  options.forEach(function (o) {
    var opt = el("option", null, o[1]);
    opt.value = String(o[0]);
    s.appendChild(opt);
  });
  s.value = String(value);
  return s;
}
function labelled(text, control) {
  var l = el("label", "ag-control", text + " ");
  l.appendChild(control);
  return l;
}
var ui = {};
function build() {
  var top = el("div", "ag-title");
  top.appendChild(el("b", null, "attngeom view"));
  top.appendChild(el("span", null, " " + meta.model + " · " + meta.mode + " store · " +
                     meta.sequences.length + " sequence(s) · config " + meta.config_hash));
  root.appendChild(top);
  var bar = el("div", "ag-controls");
  ui.seq = select("sequence", meta.sequences.map(function (s, i) {
    return [i, s.label + " (" + s.length + " tokens)" + (s.finite ? "" : " non-finite")];
  }), state.seq);
  ui.layer = select("layer", meta.layers.map(function (l, i) { return [i, l]; }), state.layer);
  ui.head = select("head", [[-1, "all (layer total)"]].concat(
    meta.heads.map(function (h, i) { return [i, h]; })), state.head);
  ui.query = el("input");
  ui.query.type = "number"; ui.query.min = 0; ui.query.setAttribute("data-role", "query");
  [["sequence", ui.seq], ["layer", ui.layer], ["head", ui.head], ["query", ui.query]]
    .forEach(function (p) { bar.appendChild(labelled(p[0], p[1])); });
  root.appendChild(bar);
  var row = el("div", "ag-row"), left = el("div", "ag-panel ag-map-panel");
  var mapNames = Object.keys(meta.maps.names);
  state.map = mapNames[0];
  ui.map = select("map", mapNames.map(function (n) { return [n, meta.maps.names[n]]; }), state.map);
  ui.scope = select("scope", [["sequence", "this sequence"],
                              ["pooled", "all " + meta.sequences.length + " sequences (pooled)"]],
                    state.scope);
  var mapBar = el("div", "ag-controls");
  mapBar.appendChild(labelled("map", ui.map));
  mapBar.appendChild(labelled("over", ui.scope));
  left.appendChild(mapBar);
  left.appendChild(el("div", "ag-caption", "layers (rows) × heads (columns): mean over queries " +
                      "i ≥ " + K + "; click a cell to show that layer and head"));
  ui.mapBox = el("div", "ag-map");
  left.appendChild(ui.mapBox);
  ui.mapLegend = el("div", "ag-legend");
  left.appendChild(ui.mapLegend);
  var main = el("div", "ag-panel ag-main");
  ui.info = el("div", "ag-info");
  main.appendChild(ui.info);
  var strips = el("div", "ag-controls");
  ui.a = select("strip-a", [], state.a);
  ui.b = select("strip-b", [], state.b);
  strips.appendChild(labelled("upper band", ui.a));
  strips.appendChild(labelled("lower band", ui.b));
  main.appendChild(strips);
  main.appendChild(el("div", "ag-caption", "click a token to make it the query (← → move it); " +
                      "hover a token for its numbers"));
  ui.legends = el("div", "ag-legends");
  main.appendChild(ui.legends);
  ui.strip = el("div", "ag-strip");
  main.appendChild(ui.strip);
  if (!compact) {
    var heat = el("div", "ag-heat-panel");
    ui.heat = select("heat", [], state.heat);
    heat.appendChild(labelled("query × key:", ui.heat));
    ui.canvas = el("canvas", "ag-heat");
    heat.appendChild(ui.canvas);
    ui.heatLegend = el("div", "ag-legend");
    heat.appendChild(ui.heatLegend);
    main.appendChild(heat);
  }
  row.appendChild(left);
  row.appendChild(main);
  root.appendChild(row);
  root.appendChild(el("div", "ag-foot", meta.note));
  ui.tip = el("div", "ag-tip");
  root.appendChild(ui.tip);
  wire();
}
function wire() {
  ui.seq.addEventListener("change", function () { state.seq = +ui.seq.value; show(); });
  ui.layer.addEventListener("change", function () { state.layer = +ui.layer.value; render(); });
  ui.head.addEventListener("change", function () { state.head = +ui.head.value; render(); });
  ui.query.addEventListener("change", function () { setQuery(+ui.query.value); });
  ui.a.addEventListener("change", function () { state.a = ui.a.value; render(); });
  ui.b.addEventListener("change", function () { state.b = ui.b.value; render(); });
  ui.map.addEventListener("change", function () { state.map = ui.map.value; renderMap(); });
  ui.scope.addEventListener("change", function () { state.scope = ui.scope.value; renderMap(); });
  if (ui.heat) ui.heat.addEventListener("change", function () { state.heat = ui.heat.value; renderHeat(); });
  root.addEventListener("keydown", function (e) {
    if (e.target.tagName === "SELECT" || e.target.tagName === "INPUT") return;
    if (e.key === "ArrowLeft") setQuery(state.query - 1);
    else if (e.key === "ArrowRight") setQuery(state.query + 1);
  });
  root.addEventListener("mouseleave", hideTip);
}
function setQuery(i) {
  var n = meta.sequences[state.seq].length;
  state.query = Math.max(0, Math.min(n - 1, isFinite(i) ? Math.round(i) : n - 1));
  render();
}

// ------------------------------------------------------------------ tooltip
function showTip(evt, title, lines) {
  var tip = ui.tip;
  tip.innerHTML = "";
  tip.appendChild(el("div", "ag-tip-title", title));
  lines.forEach(function (ln) {
    var d = el("div", "ag-tip-line", ln[1] + " = " + fmt(ln[2]));
    d.setAttribute("data-metric", ln[0]);
    tip.appendChild(d);
  });
  tip.style.display = "block";
  var x = Math.min(evt.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
  var y = evt.clientY + 14 + tip.offsetHeight > window.innerHeight ? evt.clientY - tip.offsetHeight - 10
    : evt.clientY + 14;
  tip.style.left = Math.max(0, x) + "px";
  tip.style.top = Math.max(0, y) + "px";
}
function hideTip() { ui.tip.style.display = "none"; }
function hover(node, fn) {
  node.addEventListener("mousemove", function (e) { var t = fn(e); if (t) showTip(e, t[0], t[1]); });
  node.addEventListener("mouseleave", hideTip);
}

// ------------------------------------------------------------------ rendering
function options(sel, wanted) {
  var keep = Object.keys(METRICS).filter(usable);
  sel.innerHTML = "";
  keep.forEach(function (m) {
    var o = el("option", null, metricLabel(m));
    o.value = m;
    sel.appendChild(o);
  });
  var v = keep.indexOf(wanted) >= 0 ? wanted : keep[0];
  sel.value = v;
  return v;
}
function legend(box, title, s) {
  box.innerHTML = "";
  var bar = el("span", "ag-bar");
  var stops = [0, 0.25, 0.5, 0.75, 1].map(function (t) {
    var v = s.lo + t * (s.hi - s.lo);
    return css(s.color(v)) + " " + (t * 100) + "%";
  });
  bar.style.background = "linear-gradient(to right, " + stops.join(", ") + ")";
  if (title) box.appendChild(el("span", "ag-legend-title", title));
  box.appendChild(el("span", "ag-tick", fmt(s.lo)));
  box.appendChild(bar);
  box.appendChild(el("span", "ag-tick", fmt(s.hi)));
}
function tokenTitle(j) {
  var s = meta.sequences[state.seq];
  return "token " + j + " " + JSON.stringify(s.raw[j]);
}
function keyKind(i, j) {
  if (j === i) return "query";
  var s = slot(i, j);
  return s ? s.group : "middle";
}
function render() {
  if (!arrays) return;
  hideTip();                         // its numbers may belong to the previous query
  var seq = meta.sequences[state.seq], n = seq.length, i = state.query;
  ui.layer.value = String(state.layer); ui.head.value = String(state.head);
  ui.query.max = n - 1; ui.query.value = String(i);
  state.a = options(ui.a, state.a);
  state.b = options(ui.b, state.b);
  var bands = [state.a, state.b], cells = [];
  var keyVals = bands.map(function (m) {
    var v = [];
    for (var j = 0; j < n; j++) v.push(keyValue(m, i, j));
    return v;
  });
  var scales = bands.map(function (m, b) { return scale(METRICS[m].kind, keyVals[b]); });
  ui.legends.innerHTML = "";
  bands.forEach(function (m, b) {
    var box = el("div", "ag-legend");
    legend(box, (b ? "lower: " : "upper: ") + metricLabel(m), scales[b]);
    ui.legends.appendChild(box);
  });
  ui.strip.innerHTML = "";
  var learned = learnedValue(i);
  if (learned !== null && learned !== undefined) {
    cells.push(summaryCell("learned", "learned sink", bands.map(function (m) {
      return m === "alpha" ? learned : null;
    }), scales, function () {
      return ["learned sink (a virtual key with no value) of query " + i,
              [["alpha", metricLabel("alpha"), learned]]];
    }));
  }
  if (compact && middleCount(i) > 0) {
    var count = middleCount(i);
    cells.push(summaryCell("middle", "Σ " + count + " middle", bands.map(function (m) {
      return middleValue(m, i);
    }), scales, function () {
      var lines = [["middle_count", "middle keys", count]];
      ["alpha", "contribution"].filter(usable).forEach(function (m) {
        lines.push([m, "Σ " + metricLabel(m), middleValue(m, i)]);
      });
      return ["Σ over the " + count + " middle keys of query " + i + " (not stored one by one)", lines];
    }));
  }
  var end = 0;                       // long sequences: the sinks and a window at the query
  shownKeys(i, n).forEach(function (r) {
    if (r[0] > end) cells.push(gapCell(end, r[0]));
    for (var j = r[0]; j < r[1]; j++) cells.push(tokenCell(j, i, keyVals, scales));
    end = r[1];
  });
  if (end < n) cells.push(gapCell(end, n));
  cells.forEach(function (c) { ui.strip.appendChild(c); });
  renderInfo();
  renderMap();
  renderHeat();
  root.setAttribute("data-state", "ready");
  root.setAttribute("data-query", String(i));
}
var WINDOW = 256;                    // key cells drawn at once (the sink keys come on top)
function shownKeys(i, n) {           // [lo, hi) ranges of the keys drawn for query i
  if (n <= WINDOW + K) return [[0, n]];
  var lo = Math.max(K, Math.min(n - WINDOW, i + 1 + (WINDOW >> 3) - WINDOW));
  return K > 0 ? [[0, K], [lo, lo + WINDOW]] : [[lo, lo + WINDOW]];
}
function gapCell(from, to) {         // keys not drawn: a click moves the query into them
  var c = el("div", "ag-cell ag-summary ag-gap", "… " + (to - from) + " tokens");
  c.setAttribute("data-cell", "gap");
  c.setAttribute("data-range", from + ":" + to);
  c.addEventListener("click", function () { setQuery(from > state.query ? from : to - 1); });
  hover(c, function () {
    return ["tokens " + from + "–" + (to - 1) + " (not drawn: the strip shows " + WINDOW +
            " keys around the query; click to move the query there)", []];
  });
  return c;
}
function band(value, s, which) {
  var b = el("div", "ag-band");
  b.setAttribute("data-band", which);
  if (value === null || value === undefined) b.classList.add("ag-none");
  else if (isNaN(value)) b.classList.add("ag-nan");
  else b.style.background = css(s.color(value));
  return b;
}
function summaryCell(kind, text, values, scales, tip) {
  var c = el("div", "ag-cell ag-summary");
  c.setAttribute("data-cell", kind);
  c.appendChild(el("div", "ag-tok", text));
  values.forEach(function (v, b) { c.appendChild(band(v, scales[b], b ? "b" : "a")); });
  hover(c, tip);
  return c;
}
function tokenCell(j, i, keyVals, scales) {
  var seq = meta.sequences[state.seq], kind = keyKind(i, j);
  var c = el("div", "ag-cell ag-" + kind);
  c.setAttribute("data-pos", String(j));
  if (seq.special[j]) c.classList.add("ag-special");
  c.appendChild(el("div", "ag-tok", seq.tokens[j]));
  keyVals.forEach(function (v, b) { c.appendChild(band(v[j], scales[b], b ? "b" : "a")); });
  c.addEventListener("click", function () { setQuery(j); });
  hover(c, function () {
    var s = slot(i, j), group = s ? (s.group === "tail" ? "tail, lag " + (i - j) : s.group)
      : "middle key: only the middle total is stored";
    var lines = Object.keys(METRICS).filter(usable).map(function (m) {
      return [m, metricLabel(m), keyValue(m, i, j)];
    });
    return [tokenTitle(j) + " as key of query " + i + " (" + group + ")", lines];
  });
  return c;
}
function groupSums(m, i) {          // Σ over the stored keys of each group, for the info line
  var sums = {}, n = meta.sequences[state.seq].length;
  for (var j = 0; j < n; j++) {
    var s = slot(i, j), v = pairValue(m, i, j);
    if (s && v !== undefined && v !== null && !isNaN(v)) sums[s.group] = (sums[s.group] || 0) + v;
  }
  var mid = middleValue(m, i);
  if (mid !== null && !isNaN(mid)) sums.middle = mid;
  return sums;
}
function renderInfo() {
  var seq = meta.sequences[state.seq], i = state.query;
  var where = "layer " + meta.layers[state.layer] + ", " +
    (isTotal() ? "all heads (layer total)" : "head " + meta.heads[state.head]);
  var parts = ["query " + i + " " + JSON.stringify(seq.raw[i]) + " · " + where];
  ["alpha", "contribution"].filter(usable).forEach(function (m) {
    var s = groupSums(m, i), keys = Object.keys(s);
    var total = keys.reduce(function (t, k) { return t + s[k]; }, 0);
    parts.push("Σ " + metricLabel(m) + ": " + keys.map(function (k) {
      return (k === "key" ? "all keys" : k) + " " + fmt(s[k]);
    })
      .join(", ") + (keys.length > 1 ? " (total " + fmt(total) + ")" : ""));
  });
  ui.info.textContent = parts.join(" · ");
}
function mapValue(name, l, h) {
  var src = state.scope === "pooled" ? meta.maps.pooled[name] : meta.maps.per_sequence[name][state.seq];
  var v = src[l * H + h];
  return v === null ? NaN : v;
}
function renderMap() {
  var name = state.map, values = [];
  for (var l = 0; l < L; l++) for (var h = 0; h < H; h++) values.push(mapValue(name, l, h));
  var s = scale(name.indexOf("contribution") >= 0 ? "signed" : "prob", values);
  var cw = Math.max(10, Math.min(30, Math.floor(300 / H))), ch = Math.max(6, Math.min(20, Math.floor(560 / L)));
  var left = 34, top = 16, NS = "http://www.w3.org/2000/svg";
  var svg = document.createElementNS(NS, "svg");
  svg.setAttribute("width", left + cw * H + 2);
  svg.setAttribute("height", top + ch * L + 2);
  function text(x, y, t, anchor) {
    var e = document.createElementNS(NS, "text");
    e.setAttribute("x", x); e.setAttribute("y", y); e.setAttribute("text-anchor", anchor);
    e.setAttribute("class", "ag-axis"); e.textContent = t;
    svg.appendChild(e);
  }
  var every = Math.ceil(12 / ch), hEvery = Math.ceil(16 / cw);
  for (var hh = 0; hh < H; hh += hEvery) text(left + cw * (hh + 0.5), top - 4, meta.heads[hh], "middle");
  for (var ll = 0; ll < L; ll += every) text(left - 4, top + ch * (ll + 0.5) + 4, meta.layers[ll], "end");
  values.forEach(function (v, n) {
    var l = Math.floor(n / H), h = n % H, r = document.createElementNS(NS, "rect");
    r.setAttribute("x", left + h * cw); r.setAttribute("y", top + l * ch);
    r.setAttribute("width", cw - 1); r.setAttribute("height", ch - 1);
    r.setAttribute("fill", isFinite(v) ? css(s.color(v)) : "#e6e6e6");
    r.setAttribute("data-layer", String(l)); r.setAttribute("data-head", String(h));
    r.setAttribute("class", "ag-map-cell");
    if (l === state.layer && (h === state.head || isTotal())) r.setAttribute("class", "ag-map-cell ag-picked");
    r.addEventListener("click", function () { state.layer = l; state.head = h; render(); });
    hover(r, function () {
      return ["layer " + meta.layers[l] + ", head " + meta.heads[h] + (state.scope === "pooled"
        ? " (pooled over the view's finite sequences)" : " (sequence " + meta.sequences[state.seq].label + ")"),
              [[name, meta.maps.names[name], v]]];
    });
    svg.appendChild(r);
  });
  ui.mapBox.innerHTML = "";
  ui.mapBox.appendChild(svg);
  legend(ui.mapLegend, "", s);
}
function renderHeat() {
  if (!ui.canvas) return;
  state.heat = options(ui.heat, state.heat);
  var n = meta.sequences[state.seq].length, m = state.heat, vals = new Array(n * n);
  for (var i = 0; i < n; i++) for (var j = 0; j < n; j++) vals[i * n + j] = keyValue(m, i, j);
  var s = scale(METRICS[m].kind, vals);
  var px = Math.max(2, Math.min(24, Math.floor(420 / n))), cv = ui.canvas;
  cv.width = n * px; cv.height = n * px;
  var ctx = cv.getContext("2d"), img = ctx.createImageData(n, n);
  vals.forEach(function (v, k) {
    var c = v === null || v === undefined || isNaN(v) ? [235, 235, 235] : s.color(v);
    img.data[4 * k] = c[0]; img.data[4 * k + 1] = c[1]; img.data[4 * k + 2] = c[2]; img.data[4 * k + 3] = 255;
  });
  var off = document.createElement("canvas");
  off.width = n; off.height = n;
  off.getContext("2d").putImageData(img, 0, 0);
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(off, 0, 0, n * px, n * px);
  ctx.strokeStyle = "#000"; ctx.lineWidth = 1;
  ctx.strokeRect(0.5, state.query * px + 0.5, n * px - 1, px - 1);
  legend(ui.heatLegend, metricLabel(m) + " (rows: queries, columns: keys)", s);
  cv.onclick = function (e) { setQuery(Math.floor(e.offsetY / (cv.clientHeight / n))); };
  cv.onmousemove = function (e) {
    var i = Math.floor(e.offsetY / (cv.clientHeight / n)), j = Math.floor(e.offsetX / (cv.clientWidth / n));
    if (i < 0 || j < 0 || i >= n || j >= n) return;
    showTip(e, "query " + i + ", " + tokenTitle(j), [[m, metricLabel(m), keyValue(m, i, j)]]);
  };
  cv.onmouseleave = hideTip;
}
function show() {
  root.setAttribute("data-state", "loading");
  var s = state.seq;
  load(s).then(function (a) {
    if (s !== state.seq) return;
    arrays = a;
    var n = meta.sequences[s].length;
    if (state.query >= n) state.query = n - 1;
    render();
  }).catch(function (err) {
    root.setAttribute("data-state", "error");
    ui.info.textContent = "attngeom view: cannot decode the data: " + err.message;
  });
}
var fallback = root.querySelector(".ag-fallback");
if (fallback) fallback.parentNode.removeChild(fallback);
build();
show();
