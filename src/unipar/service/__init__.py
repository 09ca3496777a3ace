"""The shared cluster: a scheduler service that places, shares and resizes jobs live.

``state`` (SQLite store), ``decide`` (pure: policy round to target sizes), ``runner``
(one Ray actor per job running ``fit``), ``scheduler`` (the detached actor), ``client``
(``up``/``submit``/``jobs``/``logs``/``cancel``/``down``).
"""
