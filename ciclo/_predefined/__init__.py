"""Predefined loops (`train_loop`, `test_loop`, `predict_loop`) and named schedules."""
