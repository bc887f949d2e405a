// The token view (dashboards/pages/tokens.py): hovering or clicking a token chooses it, as in
// CircuitsVis. The chosen position goes into the number box `tokens-token` (set_props makes
// Dash run the page's callbacks); the server colours the other tokens.
(function () {
  let last = null;
  function choose(event, pin) {
    const span = event.target.closest ? event.target.closest(".attn-tok") : null;
    if (!span || !window.dash_clientside || !window.dash_clientside.set_props) { return; }
    const index = parseInt(span.dataset.index, 10);
    if (Number.isNaN(index) || (index === last && !pin)) { return; }
    last = index;
    window.dash_clientside.set_props("tokens-token", {value: index});
  }
  document.addEventListener("mouseover", (e) => choose(e, false));
  document.addEventListener("click", (e) => choose(e, true));
})();
