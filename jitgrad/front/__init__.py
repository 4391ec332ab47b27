"""What users call: trace and `Traced`, grad/value_and_grad/vjp, jvp and the Jacobians, vmap, custom
Functions, gradcheck and torch interop. Imports: any wing below it and the utilities."""
