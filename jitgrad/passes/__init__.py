"""IR to IR: reverse-mode autodiff, simplification (inlining, folding, CSE, DCE), recompute, fusion into
loop kernels, and the recipes that chain them. Imports: jitgrad.ir, jitgrad.tracing, jitgrad.ops, utilities."""
