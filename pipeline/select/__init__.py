"""Re-cuts of a finished run from its stored scores (`humanset select`) and what a threshold costs against hand labels (`humanset calibrate`)."""
