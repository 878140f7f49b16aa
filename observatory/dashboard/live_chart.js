// live_chart: a plotly chart that a rerun updates in place (a Streamlit v2 component, no iframe).
// st.plotly_chart mounts a new chart whenever the figure changes (its element id is the figure's hash), so
// every redraw of a live run blanked each chart for a moment; here the same <div> gets Plotly.react,
// which redraws only what changed. The title is a line of text above the plot, not plotly's title, so
// plotly's toolbar never covers it. plotly.js itself is plotly's own plotly.min.js, loaded once a page.
// data: {figure: {data, layout}, config, src: the URL of plotly.min.js}; a box selection sets the state
// value `box` ([x0, x1, n], n counting selections).
const loaded = {};

function plotly(src) {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!loaded[src]) {
    loaded[src] = new Promise((resolve, reject) => {
      const s = document.createElement("script");
      s.src = src;
      s.async = true;
      s.onload = () => resolve(window.Plotly);
      s.onerror = () => { delete loaded[src]; reject(new Error("plotly.js did not load from " + src)); };
      document.head.appendChild(s);
    });
  }
  return loaded[src];
}

function text(html) {
  // plotly's titles are escaped HTML (plot_text); shown as plain text, never parsed into the page
  return new DOMParser().parseFromString(html || "", "text/html").body.textContent || "";
}

export default function (component) {
  const { data, parentElement, setStateValue } = component;
  let root = parentElement.querySelector(".obs-chart");
  if (!root) {
    root = document.createElement("div");
    root.className = "obs-chart";
    root.innerHTML = '<div class="obs-chart-title"></div><div class="obs-chart-plot"></div>';
    parentElement.appendChild(root);
  }
  const title = root.querySelector(".obs-chart-title");
  const div = root.querySelector(".obs-chart-plot");
  const fig = data.figure;
  const layout = Object.assign({}, fig.layout);
  const t = layout.title && typeof layout.title === "object" ? layout.title.text : layout.title;
  delete layout.title;
  const words = text(t);
  if (title.textContent !== words) title.textContent = words;
  title.style.display = words ? "" : "none";
  div.style.minHeight = (layout.height || 300) + "px";  // the space is kept while plotly.js loads
  plotly(data.src).then((Plotly) => {
    Plotly.react(div, fig.data, layout, data.config);
    if (!div.__obsSelect) {
      div.__obsSelect = true;
      let n = 0;
      div.on("plotly_selected", (ev) => {
        const x = ev && ev.range && ev.range.x;
        if (x && x.length === 2) setStateValue("box", [x[0], x[1], ++n]);
      });
    }
  }).catch((e) => { title.textContent = words + " (" + e.message + ")"; });
}
