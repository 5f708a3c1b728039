"""What reads a finished run: the HTML report (``html``, with its ``charts`` and the
evidence ``run_data`` gathers) and the regression gate (``gate``: a run against a
baseline, for ``tuner check``). Everything here reads run directories through
``tuner.run`` (``RunReader``, ``RunLayout``) and may import the tuner's types; it owns no process and
is never imported by the tuner's own packages (the command passes the report writer
in)."""
