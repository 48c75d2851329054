"""The scaler: the one service that holds the Docker socket; it scales an allow-list of compose services."""
