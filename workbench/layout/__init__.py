"""Where arrays live: meshes, specs, shapes, the layout of one array and of a tree, rule tables, the linter."""
