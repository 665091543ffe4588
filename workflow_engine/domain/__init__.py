"""The engine's vocabulary: names and rules every layer shares (statuses and their sets).

Nothing here imports storage, the runtime, the API, the graph or the capabilities; they import
from here, so a rule such as "which statuses are final" is written once, below all of them.
"""
