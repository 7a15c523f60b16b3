"""The controller the faces talk to: commit order, /edit branches, model switches, reopening."""
