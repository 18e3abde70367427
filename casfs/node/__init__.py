"""The composition layer: one mount = store + index + object cache + view + promotion."""
