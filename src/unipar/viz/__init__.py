"""Pictures of where the time and memory go: the planner's predicted step timeline,
memory and time breakdowns, measured traces and run reports.

Drawing needs the ``plot`` extra (``pip install unipar[plot]``); the data behind each
picture (:mod:`unipar.viz.timeline`, :mod:`unipar.viz.bars`) does not.
"""
