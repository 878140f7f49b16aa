"""`streamlit run app.py` from a checkout: the dashboard itself is `observatory/app.py`, in the package, so
that an installed wheel serves it too (`observatory dashboard`). Run anew at every rerun. (Not beside
`observatory/dashboard/pages/`: Streamlit would take a `pages/` folder next to its script for its own pages.)"""

import runpy
from pathlib import Path

import observatory

runpy.run_path(str(Path(observatory.__file__).with_name("app.py")), run_name="__main__")
