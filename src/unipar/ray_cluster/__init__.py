"""Ray plumbing shared by every front end: joining or starting a cluster (:mod:`.session`,
:mod:`.address`), reserving resources, the live cluster as the planner sees it
(:mod:`.live`), and the supervisor of a gang of actors (:mod:`.supervisor`)."""
