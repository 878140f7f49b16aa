// after_paint: a Streamlit v2 component (no iframe; it runs in the page) whose state
// `painted` becomes true about a second after the page shows a drawn plotly trace, or
// after 10 s at most. The Live page uses it to send its chart controls and six health
// charts only once the loss chart is on screen, so the loss chart does not wait for them.
export default function (component) {
  const { setStateValue } = component;
  const SELECTOR = ".js-plotly-plot .scatterlayer .trace";
  const SETTLE_MS = 1000, GIVE_UP_MS = 10000, POLL_MS = 100;
  const t0 = Date.now();
  let timer = null;
  function poll() {
    if (document.querySelector(SELECTOR) || Date.now() - t0 > GIVE_UP_MS) {
      timer = setTimeout(() => setStateValue("painted", true), SETTLE_MS);
    } else {
      timer = setTimeout(poll, POLL_MS);
    }
  }
  poll();
  return () => clearTimeout(timer);
}
