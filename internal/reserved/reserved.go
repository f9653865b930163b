// Package reserved lets nudge's own packages define projections under the names that
// projection.New refuses to users (name.ReservedPrefix), such as the relay's (package relay), so
// that no user's projection can share their position and status.
package reserved

// NewProjection is projection.New without the check for reserved names. Package projection
// sets it when it is initialised; its type is
//
//	func(name string, cfg projection.Config, handlers ...projection.Handler) (*projection.Projection, error)
//
// held as any because this package cannot import projection (projection imports it).
var NewProjection any
