// A graph's new export file name without a redraw from scratch (issue 56 item 3).
//
// The camera button's file name is in the plotly config (toImageButtonOptions.filename,
// dashboards/figures.py `graph_config`), and names the view: the explorer's zoom sends
// "m_L1H2_pattern" for head 2. Plotly.react with a config that differs from the graph's in
// anything runs Plotly.newPlot and then Plotly.react again: two whole draws, ~150 ms each for
// a 512-token map in headless Chromium, on every head change. When the new config differs from
// the one the graph last got in the file name alone, the name is written into the graph's
// context (where the camera button reads it when pressed) and the figure is reacted to
// without a config: one draw. Any other config change goes to plotly as it is.
(function () {
  function sameButName(a, b) {
    const strip = (c) => JSON.stringify(Object.assign({}, c, {
      toImageButtonOptions: Object.assign({}, (c || {}).toImageButtonOptions, {filename: null}),
    }));
    return !!a && !!b && strip(a) === strip(b);
  }

  function wrap(Plotly) {
    if (!Plotly || Plotly.__attnlensExportName) { return Plotly; }
    const react = Plotly.react;
    Plotly.react = function (gd, data, layout, config) {
      const whole = data && !Array.isArray(data) && typeof data === "object";
      const given = whole ? data.config : config;
      const last = gd && gd.__attnlensConfig;
      const context = gd && gd._context;
      if (given && last && context && context.toImageButtonOptions && gd._fullLayout &&
          sameButName(given, last)) {
        const name = (given.toImageButtonOptions || {}).filename;
        context.toImageButtonOptions = Object.assign({}, context.toImageButtonOptions,
                                                     {filename: name});
        gd.__attnlensConfig = given;
        return whole ? react.call(this, gd, Object.assign({}, data, {config: undefined}))
                     : react.call(this, gd, data, layout);
      }
      if (gd && given) { gd.__attnlensConfig = given; }
      return react.apply(this, arguments);
    };
    Plotly.__attnlensExportName = true;
    return Plotly;
  }

  if (window.Plotly) {
    wrap(window.Plotly);
    return;
  }
  let plotly;      // plotly.js is loaded after the assets, when the first graph needs it
  Object.defineProperty(window, "Plotly", {
    configurable: true, enumerable: true,
    get() { return plotly; },
    set(value) { plotly = wrap(value); },
  });
})();
