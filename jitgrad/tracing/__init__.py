"""numpy code to IR: tracers and the primitive binders (lax), arrays captured from closures and globals,
argument binding, pytrees and numpy's dispatch tables. Imports: jitgrad.ir and the utilities."""
