"""edgeport-xnnpack."""
