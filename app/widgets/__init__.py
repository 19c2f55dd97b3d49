"""Small reusable widgets and the theme, which know nothing of chat, models or the worker."""
