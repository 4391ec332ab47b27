"""The IR: its graph (Aval, Var, Literal, Eqn, Graph), the primitive records the ops declare, and a
reference interpreter over them. Imports: the utilities only (jitgrad.errors)."""
