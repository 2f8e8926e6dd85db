"""Small, fast experiments that the chapters run and the chapter tests check."""
