package amqp

// SetAfterConnect sets the function New calls with the connection's name once its connection
// is made, before the publishing channels open (nil: none). Tests that set it must not run in
// parallel with each other.
func SetAfterConnect(f func(connectionName string)) { afterConnect = f }
