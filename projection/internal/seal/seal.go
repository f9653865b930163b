// Package seal keeps projection.Backend to the backends of this module.
//
// projection.Backend is a plug-in point between the runner and its two backends
// (projection/postgres, projection/memory), checked by one shared suite
// (projection/projectiontest); its contract (units of work, the projection's lock, crash-loop
// attempts) changes with the runner. Its Seal method takes a Token, which only packages under
// projection/ can name, so no type outside the module can implement the interface; a type may
// still wrap one of the module's backends by embedding it.
//
// The interface itself stays in package projection rather than moving here: its methods speak
// of the projection's own types (*Projection, Status, Unit, Outcome), which an internal package
// could not import without a cycle, and users pass backends around as a projection.Backend
// (projection.NewRunner, the trigger relay), which they could not name if it lived here.
package seal

// Token is the parameter type of projection.Backend's Seal method.
type Token struct{}
