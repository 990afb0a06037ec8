"""Reading the results for the dashboard: pure functions, no Streamlit, one module per job.

    connect   opening the results files for a read, shared with a training stage that writes them
    load      the results files: runs, one snapshot of the selected runs
    select    which runs to show by default, and how their set-ups differ
    ties      runs as RunSeries, their 95% intervals, leaders counting ties, the Pareto view
    tables    the comparison and paper tables as shown (text with intervals, marks, CSV)
    traffic   curves, clients, the cache and the bytes by what they carry
    groups    runs that differ only in their seed, as one group
    sweeps    which runs are one-key sweeps;  ablations: the Ablations tab's points
    params    runs' params compared and filtered
    privacy   the audit's figures beside MAUA and bytes (the Privacy tab)

The views read everything as `data.<name>`: each module's public names are here.
"""

from dashboard.data.connect import *  # noqa: F401,F403
from dashboard.data.load import *  # noqa: F401,F403
from dashboard.data.select import *  # noqa: F401,F403
from dashboard.data.ties import *  # noqa: F401,F403
from dashboard.data.tables import *  # noqa: F401,F403
from dashboard.data.traffic import *  # noqa: F401,F403
from dashboard.data.groups import *  # noqa: F401,F403
from dashboard.data.sweeps import *  # noqa: F401,F403
from dashboard.data.ablations import *  # noqa: F401,F403
from dashboard.data.params import *  # noqa: F401,F403
from dashboard.data.privacy import *  # noqa: F401,F403
