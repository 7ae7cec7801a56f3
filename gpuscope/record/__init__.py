"""Everything that runs inside the user's training process: the recorder and what it uses.

Light by rule: nothing here imports pandas, numpy or plotly, nor gpuscope's readers/, analyze/ or
render/ (tests/test_layout.py checks it). torch is used only once the training process has
imported it. Note: ``gpuscope.record`` is the recording function; this package is reached as
``gpuscope.record.recorder`` etc. through ``from gpuscope.record import ...``.
"""
