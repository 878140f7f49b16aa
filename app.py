"""`streamlit run app.py` from a checkout: the dashboard itself is `observatory/dashboard/app.py`, in the
package, so that an installed wheel serves it too (`observatory dashboard`). Run anew at every rerun."""

import runpy
from pathlib import Path

import observatory.dashboard

runpy.run_path(str(Path(observatory.dashboard.__file__).with_name("app.py")), run_name="__main__")
