// Package readme tests the repository's documentation: every Go block of README.md and
// docs/**/*.md compiles, every relative link and #anchor of the Markdown files leads
// somewhere, the shell blocks marked <!-- test --> run, the getting-started tutorial runs as
// written on PostgreSQL and RabbitMQ (TestTutorial), README.md stays within 15 KB with what a
// newcomer looks for (TestReadmeFrontPage), and every package's go doc opens with a sentence
// that names it. It holds no code of its own: see its tests.
package readme
